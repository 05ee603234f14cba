"""SIGKILL a real `ckpt serve` while it compacts: after every restart each checkpoint reads
back byte-identical and `check` finds nothing wrong; compaction then finishes what it
started.

Each round saves another version of a model (safetensors, every float changed a little, so
the previous version has deltas to find), starts `POST /v1/admin/compact` and kills the
server at a seeded random moment: in paced rounds (`rate`) the kill lands while compaction
is reading, in the others anywhere up to its end, switches included.
"""

from __future__ import annotations

import os
import random
import threading

import numpy as np
from safetensors.numpy import save

from client import VaultClient
from client.errors import ClientError
from client.transport import RetryPolicy

from .conftest import ServerProcess

SEED = int(os.environ.get("CRASH_SEED", "20261123"))
ROUNDS = 8
NS = "crash/compact"


def versions(count: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((384, 512)).astype(np.float32)
    b = rng.standard_normal((256, 256)).astype(np.float16)
    out = []
    for _ in range(count):
        out.append(save({"a": a, "b": b}))
        a = (a * (1 + 1e-4 * rng.standard_normal(a.shape))).astype(np.float32)
        b = (b + np.float16(1e-3)).astype(np.float16)
    return out


def compact_in_background(server: ServerProcess, rate: str | None) -> threading.Thread:
    def run() -> None:
        try:
            once = RetryPolicy(attempts=1)
            with VaultClient(server.url, server.token, progress=False, retry=once) as c:
                c.compact(NS, rate)
        except (ClientError, OSError):
            pass  # killed under it: the point of the test

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def read_all(server: ServerProcess, saved: dict[str, bytes]) -> None:
    with VaultClient(server.url, server.token, progress=False) as c:
        for ckpt_id, data in saved.items():
            with c.open(NS, ckpt_id, "model.safetensors") as f:
                assert f.read() == data, ckpt_id
        report = c.check()
    assert report.ok, report


def test_sigkill_during_compaction_loses_nothing(crash_server: ServerProcess) -> None:
    rng = random.Random(SEED)
    files = versions(ROUNDS + 2, SEED)
    saved: dict[str, bytes] = {}

    def save_version(i: int) -> None:
        with VaultClient(crash_server.url, crash_server.token, progress=False) as c:
            ckpt = c.save(NS, {"model.safetensors": files[i]})
        saved[ckpt.id] = files[i]

    save_version(0)
    save_version(1)
    for r in range(ROUNDS):
        save_version(r + 2)
        paced = r % 2 == 0
        worker = compact_in_background(crash_server, "2MB" if paced else None)
        threading.Event().wait(rng.uniform(0.05, 1.5 if paced else 0.25))  # the kill moment
        crash_server.kill()
        worker.join(timeout=60)
        assert not worker.is_alive()
        crash_server.restart()
        read_all(crash_server, saved)
    with VaultClient(crash_server.url, crash_server.token, progress=False) as c:
        report = c.compact(NS)
        stats = c.stats()
    assert stats["codecs"]["delta"]["chunks"] > 0, (report, SEED)
    read_all(crash_server, saved)
