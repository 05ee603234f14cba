"""Offline maintenance commands (`ckpt gc --data`, `ckpt check --data`): the engine's own
operations on a stopped server's data dir, refused while a server holds it."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checkpoint_vault.tiering import open_tier
from checkpoint_vault.tiering.runner import run_tiering
from checkpoint_vault.vault import FakeClock, Vault

from ..serverproc import ServerProcess
from ..unit.vault.helpers import stream_save


def ckpt(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPT_")}
    return subprocess.run(
        [sys.executable, "-m", "checkpoint_vault.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.slow
def test_offline_gc_refuses_a_data_dir_a_server_holds(server: ServerProcess) -> None:
    for command in ("gc", "check"):
        busy = ckpt(command, "--data", str(server.data_dir))
        assert busy.returncode == 1
        assert busy.stderr.startswith(f"ckpt {command}: ")
        assert "in use" in busy.stderr
        assert "stop it first" in busy.stderr
        assert "Traceback" not in busy.stderr


def test_offline_gc_collects_and_repacks_like_the_schedule(tmp_path: Path) -> None:
    cold_dir = tmp_path / "cold"
    cold_dir.mkdir()
    config = tmp_path / "ckpt.toml"
    config.write_text(f'[tiers.cold]\nurl = "file://{cold_dir}"\n')
    # written "ten days ago", so reservations and the GC grace have lapsed by now
    clock = FakeClock(time.time() - 10 * 86400)
    vault = Vault(
        tmp_path / "data" / "vault",
        clock=clock,
        tiers={"cold": open_tier("cold", f"file://{cold_dir}")},
    )
    try:
        rng = random.Random(4)
        recs = [stream_save(vault, "ns", {"w": rng.randbytes(150_000)}) for _ in range(4)]
        vault.set_policy("ns", {"tiering": {"target": "cold", "keep_hot_last": 0}})
        run_tiering(vault)
        for rec in recs[:3]:
            vault.lifecycle.delete("ns", rec.id)
    finally:
        vault.close()

    dry = ckpt(
        "gc", "--data", str(tmp_path / "data"), "--config", str(config), "--dry-run", "--json"
    )
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["dry_run"] is True
    assert "packs_rewritten" not in json.loads(dry.stdout)
    done = ckpt("gc", "--data", str(tmp_path / "data"), "--config", str(config), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["chunks_deleted"] > 0
    assert result["packs_rewritten"] == 1
    assert result["pack_bytes_freed"] > 300_000
    checked = ckpt("check", "--data", str(tmp_path / "data"), "--config", str(config), "--json")
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["checkpoints"] == 1
