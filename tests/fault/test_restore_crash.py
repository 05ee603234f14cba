"""A server killed while it writes a file a client handed over to restore into: the
client's retry hands the file over again to the restarted server, which starts it anew,
and the load ends with exactly the stored bytes and nothing half-written left behind."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from client import RetryPolicy, VaultClient

from .conftest import ServerProcess

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
