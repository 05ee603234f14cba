"""The client keeps its promises when the network or the server fails mid-save."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.client import RetryPolicy, TransportError, VaultClient

from ..serverproc import ServerProcess
from .forkscript import run_fork_script
from .proxy import CuttingProxy


@pytest.fixture
def proxy(server: ServerProcess) -> Iterator[CuttingProxy]:
    p = CuttingProxy(server.port)
    yield p
    p.close()


def test_save_survives_a_connection_dropped_mid_upload(
    server: ServerProcess, proxy: CuttingProxy, tmp_path: Path
) -> None:
    data = random.Random(3).randbytes(20 << 20)
    with VaultClient(f"http://127.0.0.1:{proxy.port}", server.token, progress=False) as vault:
        proxy.cut_after(5 << 20)  # inside the first chunk batches
        ckpt = vault.save("f/drop", {"w.bin": data})
        assert proxy.cuts == 1
        assert vault.transfer.retries >= 1
        proxy.cut_download_after(3 << 20)  # and a download cut halfway resumes by Range
        vault.load("f/drop", ckpt.id, tmp_path)
        assert proxy.cuts == 2
    assert (tmp_path / "w.bin").read_bytes() == data
    assert not list(tmp_path.glob("*.ckpt-part"))


def test_a_failed_file_stops_the_whole_load_and_leaves_no_partial_files(
    server: ServerProcess, proxy: CuttingProxy, tmp_path: Path
) -> None:
    rng = random.Random(4)
    files = {f"f{i}.bin": rng.randbytes(12 << 20) for i in range(4)}  # loaded two at a time
    with VaultClient(server.url, server.token, progress=False) as vault:
        ckpt = vault.save("f/cut", files)
    once = RetryPolicy(attempts=1)
    with VaultClient(
        f"http://127.0.0.1:{proxy.port}", server.token, progress=False, retry=once
    ) as vault:
        proxy.cut_download_after(6 << 20)  # inside the first files
        with pytest.raises(TransportError):
            vault.load("f/cut", ckpt.id, tmp_path)
    assert proxy.cuts == 1
    assert not list(tmp_path.glob("*.ckpt-part"))  # the cut file and the one beside it
    for path in tmp_path.iterdir():  # whatever finished first is whole
        assert path.read_bytes() == files[path.name]


def test_a_load_after_the_server_restarted_needs_no_retry(
    server: ServerProcess, tmp_path: Path
) -> None:
    data = random.Random(6).randbytes(9 << 20)
    with VaultClient(
        server.url, server.token, progress=False, retry=RetryPolicy(attempts=1)
    ) as vault:
        ckpt = vault.save("f/restart", {"w.bin": data})
        vault.load("f/restart", ckpt.id, tmp_path / "a")  # leaves a kept-alive connection
        server.restart()  # which the server's end has now closed
        vault.load("f/restart", ckpt.id, tmp_path / "b")
        assert vault.transfer.retries == 0
    assert (tmp_path / "b" / "w.bin").read_bytes() == data


def test_a_streamed_read_cut_mid_way_continues_by_range(
    server: ServerProcess, proxy: CuttingProxy
) -> None:
    data = random.Random(5).randbytes(12 << 20)
    with VaultClient(f"http://127.0.0.1:{proxy.port}", server.token, progress=False) as vault:
        ckpt = vault.save("f/stream", {"w.bin": data})
        with vault.open("f/stream", ckpt.id, "w.bin") as f:
            proxy.cut_download_after(4 << 20)
            assert f.read() == data
        assert proxy.cuts == 1


class _RestartingReader:
    """A file whose second read restarts the server: the upload's missing queries happen
    before the restart and its commit after."""

    def __init__(self, data: bytes, server: ServerProcess) -> None:
        self._data = memoryview(data)
        self._pos = 0
        self._reads = 0
        self._server = server

    def read(self, n: int = -1) -> bytes:
        self._reads += 1
        if self._reads == 2:
            self._server.restart()
        end = len(self._data) if n < 0 else min(len(self._data), self._pos + n)
        out = bytes(self._data[self._pos : end])
        self._pos = end
        return out

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return 0


def test_save_survives_a_server_restart_between_missing_query_and_commit(
    server: ServerProcess, tmp_path: Path
) -> None:
    data = random.Random(4).randbytes(20 << 20)
    # The restart runs inside a read, while the previous piece's queries are in flight;
    # a loaded machine has taken over 6 s to start the server again.
    retry = RetryPolicy(attempts=40, base=0.05, cap=1.0)
    with VaultClient(server.url, server.token, retry=retry, progress=False) as vault:
        ckpt = vault.save("f/restart", {"w.bin": _RestartingReader(data, server)})  # type: ignore[dict-item]
        vault.load("f/restart", ckpt.id, tmp_path)
    assert server.starts >= 2
    assert (tmp_path / "w.bin").read_bytes() == data


CLIENT_FORK_SCRIPT = """
import gc, multiprocessing, os, sys
from checkpoint_vault.client import ClientError, VaultClient

held = [VaultClient(progress=False)]
first = held[0].save("f/fork", {"a": b"before the fork"})  # a pooled connection now


def child():
    copy = held.pop()
    try:
        copy.get("f/fork", first.id)
        sys.exit(4)  # the copy must refuse: its loop thread stayed in the parent
    except ClientError:
        pass
    try:
        copy.save("f/fork", {"a": b"in the child"})  # sent from here: the parent's sockets
        sys.exit(5)
    except ClientError:
        pass
    with VaultClient(progress=False) as own:  # a client of its own works
        ok = own.get("f/fork", first.id).id == first.id
    copy.close()  # a no-op in the child
    del copy
    gc.collect()
    sys.exit(0 if ok else 3)


for _ in range(2):
    proc = multiprocessing.get_context("fork").Process(target=child)
    proc.start()
    proc.join()
    assert proc.exitcode == 0, proc.exitcode
    assert held[0].get("f/fork", first.id).id == first.id  # hangs if the child broke our loop
held[0].close()
print("parent works after its children exited")
"""


def test_a_forked_child_leaves_the_parent_client_working(server: ServerProcess) -> None:
    out = run_fork_script(server, CLIENT_FORK_SCRIPT)
    assert out == "parent works after its children exited\n"


def test_a_small_save_whose_answer_is_lost_makes_one_checkpoint(
    server: ServerProcess, proxy: CuttingProxy
) -> None:
    """A small save goes out from the caller's thread with the retries of every request:
    its answer cut, it is sent again with the same idempotency key and answers the
    checkpoint the first try made."""
    with VaultClient(f"http://127.0.0.1:{proxy.port}", server.token, progress=False) as vault:
        proxy.cut_download_after(1)  # the save is made; its answer never arrives
        ckpt = vault.save("f/lost", {"state.json": b'{"step": 7}'}, chunking="small")
        assert proxy.cuts == 1
        assert vault.transfer.retries == 1
        assert [c.id for c in vault.list("f/lost")] == [ckpt.id]
        assert vault.read_range("f/lost", ckpt.id, "state.json", 0, 100) == b'{"step": 7}'
