"""SIGKILL a real `ckpt serve` while it compacts: after every restart each checkpoint reads
back byte-identical and `check` finds nothing wrong; compaction then finishes what it
started.

Each round saves another version of a model (safetensors, every float changed a little, so
the previous version has deltas to find), starts `POST /v1/admin/compact` and kills the
server at a seeded random moment after it took the maintenance lock for compaction: in
paced rounds (`rate`) the kill lands while compaction reads or sleeps between batches, in
the others anywhere up to its end, switches included. A kill counts as
landed when the server held the maintenance lock for compaction at that moment and the
request died with it; at least the paced half must land. An error answer fails the test.
"""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.errors import ClientError, TransportError
from checkpoint_vault.client.transport import RetryPolicy

from ..lockholder import holder_of
from .conftest import ServerProcess

SEED = int(os.environ.get("CRASH_SEED", "20261123"))
ROUNDS = 8
NS = "crash/compact"


def versions(count: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    # 10 MiB: past one compaction batch (vault/compact.py BATCH_BYTES, 4 MiB), so a paced
    # run sleeps between batches and a kill can land between two switches.
    a = rng.standard_normal((1024, 2048)).astype(np.float32)
    b = rng.standard_normal((1024, 1024)).astype(np.float16)
    out = []
    for _ in range(count):
        out.append(save({"a": a, "b": b}))
        a = (a * (1 + 1e-4 * rng.standard_normal(a.shape))).astype(np.float32)
        b = (b + np.float16(1e-3)).astype(np.float16)
    return out


def compact_in_background(
    server: ServerProcess, rate: str | None, outcome: list[str]
) -> threading.Thread:
    """Compact on a thread; `outcome` gets "killed" (the connection died with the server),
    "finished", or the error answer the server gave, which fails the test."""

    def run() -> None:
        try:
            once = RetryPolicy(attempts=1)
            with VaultClient(server.url, server.token, progress=False, retry=once) as c:
                c.compact(NS, rate)
        except (TransportError, OSError):
            outcome.append("killed")
        except ClientError as e:
            outcome.append(f"answered {e.status}: {e}")
        else:
            outcome.append("finished")

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def wait_until_compacting(lock: Path, pid: int | None, worker: threading.Thread) -> None:
    """Until the server holds the maintenance lock for compaction (or the run ended)."""
    for _ in range(2000):  # bounded; the join paces the probes and notices the end
        if holder_of(lock) == f"{pid} compact" or not worker.is_alive():
            return
        worker.join(0.005)


def read_all(server: ServerProcess, saved: dict[str, bytes]) -> None:
    with VaultClient(server.url, server.token, progress=False) as c:
        for ckpt_id, data in saved.items():
            with c.open(NS, ckpt_id, "model.safetensors") as f:
                assert f.read() == data, ckpt_id
        report = c.check()
    assert report.ok, report


@pytest.mark.slow
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
    lock = crash_server.data_dir / "vault" / "maintenance.lock"
    landed = 0  # rounds whose kill hit a compaction in progress
    for r in range(ROUNDS):
        save_version(r + 2)
        paced = r % 2 == 0
        outcome: list[str] = []
        pid = crash_server.pid
        worker = compact_in_background(crash_server, "4MiB" if paced else None, outcome)
        wait_until_compacting(lock, pid, worker)
        threading.Event().wait(rng.uniform(0.0, 1.5 if paced else 0.25))  # the kill moment
        held = holder_of(lock)
        crash_server.kill()
        worker.join(timeout=60)
        assert not worker.is_alive()
        assert outcome in (["killed"], ["finished"]), outcome  # never an error answer
        landed += outcome == ["killed"] and held == f"{pid} compact"
        crash_server.restart()
        read_all(crash_server, saved)
    print(f"CRASH_SEED={SEED}: {landed} of {ROUNDS} kills landed during compaction")
    assert landed >= ROUNDS // 2, (landed, SEED)  # the paced rounds, at least
    with VaultClient(crash_server.url, crash_server.token, progress=False) as c:
        report = c.compact(NS)
        stats = c.stats()
    assert stats.codecs["delta"].chunks > 0, (report, SEED)
    read_all(crash_server, saved)
