"""What the data dir takes on disk, as `du` sees it, against a real `ckpt serve`: GET
/v1/stats and `ckpt stats` report it and what a shrink would give back; after deleting
all but the newest checkpoint, `ckpt gc` shrinks the hot store to about that checkpoint
(it stayed 2.25x before issue 32)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from checkpoint_vault.vault.samples import allocated_bytes

from ..serverproc import ServerProcess, free_port

SIZE = 6 << 20  # one checkpoint's file


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    """`ckpt serve` whose GC takes unreferenced chunks at once (no grace, uploads expire
    within a second: their reservations hold chunks until then)."""
    config = tmp_path / "ckpt.toml"
    config.write_text('[gc]\ngrace = "0s"\n[uploads]\nttl = "1s"\n')
    proc = ServerProcess(tmp_path / "data", free_port(), tmp_path / "server.log", config)
    try:
        proc.start()
        yield proc
    finally:
        proc.stop()


def ckpt(server: ServerProcess, *args: str) -> str:
    env = {**os.environ, "CKPT_URL": server.url, "CKPT_TOKEN": server.token}
    done = subprocess.run(
        [sys.executable, "-m", "checkpoint_vault.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def stats(server: ServerProcess) -> Any:
    return json.loads(ckpt(server, "stats", "--json"))


@pytest.mark.slow
def test_stats_show_the_disk_and_gc_gives_it_back(server: ServerProcess, tmp_path: Path) -> None:
    ids = []
    for i in range(5):
        src = tmp_path / f"run{i}"
        src.mkdir()
        (src / "w.bin").write_bytes(np.random.default_rng(i).bytes(SIZE))
        ids.append(json.loads(ckpt(server, "push", "disk/ns", str(src), "--json"))["id"])
    full = stats(server)
    vault_dir = server.data_dir / "vault"
    assert full["disk_bytes"] >= 5 * SIZE  # random bytes: stored as they came
    assert abs(full["disk_bytes"] - allocated_bytes(vault_dir)) < SIZE // 4
    assert set(full["environments"]) == {"catalog", "frames"}
    for old in ids[:-1]:
        ckpt(server, "rm", "disk/ns", old)
    # Uploads expire a second after they open, each its own second; until then they hold
    # their chunks, so a GC may take some checkpoints' chunks before the others'.
    for _ in range(100):
        ckpt(server, "gc")
        if stats(server)["stored_bytes"] < 2 * SIZE:
            break
    after = stats(server)
    assert after["stored_bytes"] < 2 * SIZE
    assert after["disk_bytes"] < 1.3 * SIZE  # the newest checkpoint and LMDB's own pages
    assert allocated_bytes(vault_dir) < 1.3 * SIZE
    assert after["reclaimable_bytes"] < 0.1 * after["disk_bytes"]
    frames = after["environments"]["frames"]
    assert frames["free_bytes"] >= 3 * SIZE  # LMDB's free list keeps them, as holes
    assert frames["reclaimable_bytes"] < SIZE // 8
    table = ckpt(server, "stats")
    assert "on disk" in table
    assert "reclaimable" in table
    metrics = server.metrics()
    assert "ckpt_disk_bytes " in metrics
    assert 'ckpt_lmdb_disk_bytes{env="frames",kind="free"}' in metrics
    restored = tmp_path / "out"
    ckpt(server, "pull", "disk/ns", ids[-1], str(restored))
    assert (restored / "w.bin").read_bytes() == np.random.default_rng(4).bytes(SIZE)
    assert json.loads(ckpt(server, "check", "--json"))["ok"] is True
