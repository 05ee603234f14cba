"""An import SIGKILLed at random moments and run again: the namespace ends with every entry
exactly once, in one chain in step order (no duplicate, no gap)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checkpoint_vault.client import VaultClient

from ..serverproc import ServerProcess
from .test_import_series import js

STEPS = list(range(100, 1700, 100))  # 16 entries
ENTRY_BYTES = 5 << 20  # past the one-request limit: each save is an upload and a commit
KILLS = 3
POLL = 0.01  # seconds between looks at the namespace while the import runs
DEADLINE = 120.0  # seconds for one import run to reach its kill point


def count(vault: VaultClient, namespace: str) -> int:
    return len(vault.list(namespace, limit=1000)) if namespace in names(vault) else 0


def names(vault: VaultClient) -> set[str]:
    return {n.name for n in vault.namespaces()}


def kill_after(server: ServerProcess, vault: VaultClient, src: Path, at: int, jitter: float) -> int:
    """Run `ckpt import`, SIGKILL it once the namespace holds `at` checkpoints plus
    `jitter` seconds (mid-save, mid-commit or between saves); answer how many it holds."""
    env = {**os.environ, "CKPT_URL": server.url, "CKPT_TOKEN": server.token}
    proc = subprocess.Popen(
        [sys.executable, "-m", "checkpoint_vault.cli", "import", str(src), "imp/killed", "--json"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        end = time.monotonic() + DEADLINE
        while count(vault, "imp/killed") < at and proc.poll() is None:
            assert time.monotonic() < end, "the import made no progress"
            time.sleep(POLL)
        time.sleep(jitter)
        assert proc.poll() is None, "the import ended before it was killed"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return count(vault, "imp/killed")


@pytest.mark.slow
def test_an_import_killed_at_random_moments_finishes_without_duplicate_or_gap(
    server: ServerProcess, vault: VaultClient, tmp_path: Path
) -> None:
    src = tmp_path / "run"
    src.mkdir()
    for step in STEPS:
        (src / f"weights-{step}.bin").write_bytes(os.urandom(ENTRY_BYTES))
    rng = random.Random()
    held = 0
    for _ in range(KILLS):
        at = rng.randint(held + 1, held + 3)
        held = kill_after(server, vault, src, at, rng.uniform(0.0, 0.05))
        assert at <= held < len(STEPS)
    report = js(server, "import", str(src), "imp/killed")
    # A commit sent just before the kill may land after the count: one more is present.
    assert held <= report["present"] <= held + 1
    assert report["present"] + report["created"] == len(STEPS)

    chain = vault.list("imp/killed", limit=1000)[::-1]
    assert [c.metadata["step"] for c in chain] == STEPS
    assert chain[0].parent is None
    assert all(c.parent == p.id for c, p in zip(chain[1:], chain, strict=False))
    for ckpt in chain:
        name = f"weights-{ckpt.metadata['step']}.bin"
        assert ckpt.files[name].size == ENTRY_BYTES
