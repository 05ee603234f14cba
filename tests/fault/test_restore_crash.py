"""A server killed while it writes a file a client handed over to restore into: the
client's retry hands the file over again to the restarted server, which starts it anew,
and the load ends with exactly the stored bytes and nothing half-written left behind."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from checkpoint_vault.client import RetryPolicy, VaultClient

from .conftest import ServerProcess

pytestmark = pytest.mark.slow  # every test here takes over a second (the quick loop skips them)

MiB = 1 << 20


def test_a_restore_survives_the_server_killed_mid_file(
    crash_server: ServerProcess, tmp_path: Path
) -> None:
    source = tmp_path / "weights.bin"
    with source.open("wb") as f:
        for _ in range(24):  # 384 MiB, raw frames: long enough to be caught mid-file
            f.write(os.urandom(16 * MiB))
    # Enough tries, soon enough, to outlast a restart (~1 s here).
    patient = RetryPolicy(attempts=200, base=0.05, cap=0.25)
    with VaultClient(crash_server.url, crash_server.token, progress=False, retry=patient) as vault:
        ckpt = vault.save("crash/restore", {"weights.bin": source})
        out = tmp_path / "out"
        partial = out / "weights.bin.ckpt-part"
        failure: list[BaseException] = []

        def load() -> None:
            try:
                vault.load("crash/restore", ckpt.id, out)
            except BaseException as e:  # noqa: BLE001 - reported by the test below
                failure.append(e)

        loading = threading.Thread(target=load)
        loading.start()
        for _ in range(2000):  # bounded: until the server has the file open to write it
            if crash_server.holds_open(partial):
                break
            loading.join(0.005)
        else:
            raise AssertionError("the server never opened the file handed over")
        crash_server.kill()
        crash_server.start()
        loading.join(120)
        assert not loading.is_alive()
        assert not failure, failure
        assert vault.transfer.retries >= 1  # it was caught mid-file, and tried again
    assert (out / "weights.bin").read_bytes() == source.read_bytes()
    assert not partial.exists()


def test_ckpt_pull_killed_mid_file_leaves_nothing_behind(
    crash_server: ServerProcess, tmp_path: Path
) -> None:
    """`ckpt pull` restoring without the client (client/restore.py) hands a broken
    connection to the client, which retries and then fails the command: exit 1 with the
    reason, no part file and no file that looks restored. Once the server is back, the same
    command restores the stored bytes."""
    source = tmp_path / "weights.bin"
    with source.open("wb") as f:
        for _ in range(24):  # 384 MiB of raw frames: long enough to be caught mid-file
            f.write(os.urandom(16 * MiB))
    with VaultClient(crash_server.url, crash_server.token, progress=False) as vault:
        ckpt = vault.save("crash/pull", {"weights.bin": source})
    out = tmp_path / "out"
    partial = out / "weights.bin.ckpt-part"
    env = {**os.environ, "CKPT_URL": crash_server.url, "CKPT_TOKEN": crash_server.token}
    pull = [sys.executable, "-m", "checkpoint_vault.cli", "pull", "crash/pull", ckpt.id, str(out)]
    pulling = subprocess.Popen(pull, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for _ in range(2000):  # bounded: until the server has the file open to write it
            if crash_server.holds_open(partial):
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                pulling.wait(0.005)
            assert pulling.returncode is None, "the pull ended before the server wrote the file"
        else:
            raise AssertionError("the server never opened the file handed over")
        crash_server.kill()
        _, err = pulling.communicate(timeout=60)
    finally:
        if pulling.poll() is None:
            pulling.kill()
            pulling.wait()
    assert pulling.returncode == 1
    assert err.decode().startswith("ckpt pull: ")
    assert not partial.exists()
    assert not (out / "weights.bin").exists()

    crash_server.start()
    again = subprocess.run(pull, env=env, capture_output=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert (out / "weights.bin").read_bytes() == source.read_bytes()
    assert not partial.exists()
