"""The client against a real server: save, load, dedup on the wire, open, catalog calls."""

from __future__ import annotations

import io
import os
import random
import re
import threading
from pathlib import Path
from typing import Any

import blake3
import pytest

import checkpoint_vault.client.aio as client_aio
from checkpoint_vault.client import (
    Checkpoint,
    IntegrityError,
    InvalidName,
    InvalidRequest,
    NotFound,
    VaultClient,
)
from checkpoint_vault.protocol import FileInfo

from ..serverproc import ServerProcess

BOTH_TRANSPORTS = False  # these tests count what a save sends over HTTP: the socket off only


def test_small_save_is_one_request_and_round_trips(vault: VaultClient, tmp_path: Path) -> None:
    before = vault.transfer.requests
    ckpt = vault.save(
        "c/small",
        {"state.json": b'{"step": 1}', "empty": b""},
        metadata={"step": 1},
        chunking="small",
    )
    assert vault.transfer.requests - before == 1
    assert ckpt.files["state.json"].hash == blake3.blake3(b'{"step": 1}').hexdigest()
    loaded = vault.load("c/small", ckpt.id, tmp_path)
    assert loaded.id == ckpt.id
    assert (tmp_path / "state.json").read_bytes() == b'{"step": 1}'
    assert (tmp_path / "empty").read_bytes() == b""


def test_a_small_save_needs_nothing_of_the_clients_loop_thread(vault: VaultClient) -> None:
    """`VaultClient.save` of a small checkpoint is sent from the caller's thread: with the
    client's loop thread held busy, it still completes."""
    held, release = threading.Event(), threading.Event()
    released: list[bool] = []  # False: the hold timed out (the save waited for the loop)

    def hold() -> None:
        held.set()
        released.append(release.wait(5))

    vault._loop.call_soon_threadsafe(hold)
    assert held.wait(10)
    try:
        ckpt = vault.save("c/here", {"state.json": b'{"step": 2}'}, chunking="small")
    finally:
        release.set()
    assert vault.read_range("c/here", ckpt.id, "state.json", 0, 100) == b'{"step": 2}'
    assert released == [True]  # read_range ran on the loop: the hold has ended


def test_a_list_needs_nothing_of_the_clients_loop_thread(vault: VaultClient) -> None:
    """`VaultClient.list` is one small request sent from the caller's thread (LangGraph's
    VaultSaver lists once per graph run): with the loop thread held busy, it completes."""
    saved = vault.save("c/listed", {"a": b"1"}, tags=["t"], chunking="small")
    held, release = threading.Event(), threading.Event()
    released: list[bool] = []  # False: the hold timed out (the list waited for the loop)

    def hold() -> None:
        held.set()
        released.append(release.wait(5))

    vault._loop.call_soon_threadsafe(hold)
    assert held.wait(10)
    try:
        listed = vault.list("c/listed", limit=5, tag="t")
        with pytest.raises(NotFound):
            vault.list("c/never-saved")
    finally:
        release.set()
    assert [c.id for c in listed] == [saved.id]
    assert vault.get("c/listed").id == saved.id  # on the loop: the hold has ended
    assert released == [True]


def test_a_small_saves_metadata_means_what_its_json_means(vault: VaultClient) -> None:
    """A one-request save's header is written by orjson when that means the same JSON
    (client/fastjson.py): None, int keys and huge ints arrive as json.dumps wrote them,
    and a NaN is still refused by the server rather than stored as a null."""
    meta: dict[Any, Any] = {"none": None, "kind": "null", 7: "int key", "big": 2**70, "text": "é"}
    ckpt = vault.save("c/meta", {"a": b"1"}, metadata=meta, chunking="small")
    want = {"none": None, "kind": "null", "7": "int key", "big": 2**70, "text": "é"}
    assert ckpt.metadata == want
    assert vault.get("c/meta", ckpt.id).metadata == want
    with pytest.raises(InvalidRequest, match="NaN"):
        vault.save("c/meta", {"a": b"2"}, metadata={"loss": float("nan")}, chunking="small")


def test_large_save_sends_only_changed_chunks(vault: VaultClient, tmp_path: Path) -> None:
    data = bytearray(random.Random(1).randbytes(24 << 20))
    src = tmp_path / "model.bin"
    src.write_bytes(data)
    first = vault.save("c/large", {"model.bin": src})
    data[10 << 20 : (10 << 20) + 4096] = os.urandom(4096)
    src.write_bytes(data)
    sent = vault.transfer.bytes_sent
    second = vault.save("c/large", {"model.bin": src}, parent=first.id)
    on_wire = vault.transfer.bytes_sent - sent
    assert on_wire < 600_000, on_wire  # a few 64 KiB chunks plus the id lists, not 24 MiB
    assert second.parent == first.id
    out = tmp_path / "out"
    vault.load("c/large", "latest", out)
    assert (out / "model.bin").read_bytes() == bytes(data)


def _file_hashes(server: ServerProcess) -> dict[str, float]:
    """The server's ckpt_commit_file_hashes_total, by how."""
    found = re.findall(
        r'^ckpt_commit_file_hashes_total\{how="(\w+)"\} (\S+)$', server.metrics(), re.M
    )
    return {how: float(n) for how, n in found}


def _resave(
    vault: VaultClient, server: ServerProcess, src: Path, ns: str, first: bytes, then: bytes
) -> tuple[Checkpoint, dict[str, float]]:
    """Save `first`, then `then` from the same path into `ns`: the second checkpoint, and
    how many of its files the commit proved each way (ckpt_commit_file_hashes)."""
    src.write_bytes(first)
    vault.save(ns, {"f.bin": src})
    src.write_bytes(then)
    before = _file_hashes(server)
    ckpt = vault.save(ns, {"f.bin": src})
    after = _file_hashes(server)
    return ckpt, {how: after[how] - before[how] for how in after}


def test_files_are_hashed_as_they_arrive_whatever_the_vault_has(
    vault: VaultClient, server: ServerProcess, tmp_path: Path
) -> None:
    """Chunks the vault has (a repeat, or most of a file saved before) go as references in
    a batch that says where it lies, so the server hashes the file as it arrives and the
    commit reads nothing back; a file with nothing new sends no batch at all and is proven
    by its parent's identical entry (ckpt_commit_file_hashes)."""
    block = os.urandom(1 << 20)
    data = block + os.urandom(8 << 20) + block + os.urandom(4 << 20)  # one 14 MiB piece
    src = tmp_path / "repeats.bin"
    src.write_bytes(data)
    start = _file_hashes(server)
    first = vault.save("c/repeats", {"f.bin": src})
    assert first.files["f.bin"].hash == blake3.blake3(data).hexdigest()

    mostly_known = data[: 12 << 20] + os.urandom(3 << 20)
    src.write_bytes(mostly_known)
    sent = vault.transfer.bytes_sent
    second = vault.save("c/repeats", {"f.bin": src}, parent=first.id)
    assert vault.transfer.bytes_sent - sent < 4 << 20  # the new 3 MiB, not 15
    assert second.files["f.bin"].hash == blake3.blake3(mostly_known).hexdigest()
    hashed = _file_hashes(server)
    assert hashed["on_arrival"] - start["on_arrival"] == 2
    assert hashed["read_back"] == start["read_back"]

    requests = vault.transfer.requests
    third = vault.save("c/repeats", {"f.bin": src}, parent=second.id)
    assert vault.transfer.requests - requests == 3  # open, one missing query, commit
    assert third.files["f.bin"].hash == second.files["f.bin"].hash
    assert _file_hashes(server)["same_file"] - hashed["same_file"] == 1
    out = tmp_path / "out"
    vault.load("c/repeats", third.id, out)
    assert (out / "f.bin").read_bytes() == mostly_known


def test_a_file_ending_in_known_pieces_is_hashed_as_it_arrives(
    vault: VaultClient, server: ServerProcess, tmp_path: Path
) -> None:
    """The references held for pieces with nothing new at the end of a file that sent
    something go on their own, so the server's hash of it is complete."""
    known = os.urandom(20 << 20)
    data = os.urandom(client_aio.PIECE) + known  # new, then a piece and more the vault has
    ckpt, proved = _resave(vault, server, tmp_path / "tail.bin", "c/tail", known, data)
    assert proved["on_arrival"] == 1
    assert proved["read_back"] == 0
    assert ckpt.files["f.bin"].hash == blake3.blake3(data).hexdigest()


def test_a_long_run_of_known_pieces_gives_up_the_place(
    vault: VaultClient, server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """References held for pieces with nothing new are bounded: past the bound the rest of
    the file goes without its place and its commit reads it back, with the right hash."""
    monkeypatch.setattr(client_aio, "MAX_HELD_BYTES", 1 << 20)
    known = os.urandom(client_aio.PIECE)
    data = known + os.urandom(4 << 20)
    ckpt, proved = _resave(vault, server, tmp_path / "known.bin", "c/held", known, data)
    assert proved["read_back"] == 1
    assert ckpt.files["f.bin"].hash == blake3.blake3(data).hexdigest()


def test_a_long_run_of_known_pieces_after_new_ones_goes_as_references(
    vault: VaultClient, server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the bound, the references held in a file that already sent something go on
    their own instead of giving up its place: the server's hash stays complete."""
    monkeypatch.setattr(client_aio, "MAX_HELD_BYTES", 1 << 20)
    known = os.urandom(2 * client_aio.PIECE)
    data = os.urandom(client_aio.PIECE) + known + os.urandom(4 << 20)
    ckpt, proved = _resave(vault, server, tmp_path / "middle.bin", "c/middle", known, data)
    assert proved["on_arrival"] == 1
    assert proved["read_back"] == 0
    assert ckpt.files["f.bin"].hash == blake3.blake3(data).hexdigest()


def test_directory_save_with_nested_files_and_file_objects(
    vault: VaultClient, tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    (root / "shards").mkdir(parents=True)
    (root / "meta.json").write_bytes(b"{}")
    (root / "shards" / "0.bin").write_bytes(os.urandom(6 << 20))
    ckpt = vault.save("c/dir", root)
    assert sorted(ckpt.files) == ["meta.json", "shards/0.bin"]
    with open(root / "shards" / "0.bin", "rb") as f:
        via_fileobj = vault.save("c/dir", {"again.bin": f})
    assert via_fileobj.files["again.bin"].hash == ckpt.files["shards/0.bin"].hash
    vault.load("c/dir", ckpt.id, tmp_path / "restored")
    assert (tmp_path / "restored" / "shards" / "0.bin").read_bytes() == (
        root / "shards" / "0.bin"
    ).read_bytes()


def test_open_reads_ranges_and_seeks(vault: VaultClient) -> None:
    data = random.Random(2).randbytes(5 << 20)
    ckpt = vault.save("c/open", {"w.bin": io.BytesIO(data)})
    with vault.open("c/open", ckpt.id, "w.bin") as f:
        assert f.read(10) == data[:10]
        f.seek(3 << 20)
        assert f.read(100) == data[3 << 20 : (3 << 20) + 100]
        f.seek(-5, io.SEEK_END)
        assert f.read() == data[-5:]
        f.seek(0)
        assert f.read() == data
    with pytest.raises(NotFound):
        vault.open("c/open", ckpt.id, "absent")


def test_open_streams_sequential_reads_in_one_request(vault: VaultClient) -> None:
    data = random.Random(4).randbytes(20 << 20)
    ckpt = vault.save("c/stream", {"w.bin": data})
    with vault.open("c/stream", ckpt.id, "w.bin") as f:
        f.seek(-100, io.SEEK_END)
        assert f.read() == data[-100:]  # a zip reader's first look: one Range request
        f.seek(0)
        before = vault.transfer.requests
        pieces = []
        while piece := f.read(256 << 10):
            pieces.append(piece)
        assert b"".join(pieces) == data
        assert vault.transfer.requests - before <= 2  # was one request per MiB


def test_raw_reads_near_the_stream_cost_no_request(vault: VaultClient) -> None:
    """What torch.load does between tensors: re-read a few bytes back, skip padding."""
    data = random.Random(6).randbytes(12 << 20)
    ckpt = vault.save("c/near", {"w.bin": data})
    with vault.open("c/near", ckpt.id, "w.bin") as f:
        raw = f.raw
        before = vault.transfer.requests
        assert raw.read(1 << 20) == data[: 1 << 20]  # opens the stream
        raw.seek(-30, io.SEEK_CUR)
        assert raw.read(30) == data[(1 << 20) - 30 : 1 << 20]  # from the last piece
        raw.seek(100_000, io.SEEK_CUR)
        assert raw.read(1 << 20) == data[(1 << 20) + 100_000 : (2 << 20) + 100_000]  # skipped
        assert vault.transfer.requests - before == 1
        raw.seek(9 << 20)
        assert raw.read(10) == data[9 << 20 : (9 << 20) + 10]  # far: a Range request
        assert vault.transfer.requests - before == 2


def test_namespaces_a_url_would_rewrite_are_refused(vault: VaultClient) -> None:
    for bad in ("a/../b", "a/./b", "a//b", "/a"):
        with pytest.raises(InvalidName):
            vault.save(bad, {"f": b"x"})
    assert "b" not in {n.name for n in vault.namespaces()}


def test_catalog_calls(vault: VaultClient) -> None:
    a = vault.save("c/cat", {"f": b"a"}, tags=["x"])
    b = vault.save("c/cat", {"f": b"b"}, parent="latest")
    vault.mark_invalid("c/cat", b.id, "NaN loss")
    assert vault.get("c/cat", "latest-valid").id == a.id
    assert vault.mark_valid("c/cat", a.id).valid is True
    assert [c.id for c in vault.list("c/cat")] == [b.id, a.id]
    assert [c.id for c in vault.list("c/cat", tag="x")] == [a.id]
    assert [c.id for c in vault.lineage("c/cat", b.id)] == [b.id, a.id]
    assert vault.pin("c/cat", a.id).pinned
    vault.delete("c/cat", b.id)
    assert [c.id for c in vault.list("c/cat")] == [a.id]
    with pytest.raises(NotFound):
        vault.get("c/cat", b.id)
    assert vault.stats().checkpoints >= 1


def test_load_refuses_bytes_that_do_not_match(vault: VaultClient, tmp_path: Path) -> None:
    ckpt = vault.save("c/verify", {"f": b"payload"})
    tampered = type(ckpt)(**{**ckpt.__dict__, "files": {"f": FileInfo(7, "0" * 64)}})
    with pytest.raises(IntegrityError):
        vault._run(
            vault.aio._download(tampered, "f", tampered.files["f"], tmp_path / "f", _NoBar())
        )
    assert not (tmp_path / "f").exists()
    assert not list(tmp_path.iterdir())


def test_a_refused_download_raises_its_error_and_leaves_no_file(
    vault: VaultClient, tmp_path: Path
) -> None:
    ckpt = vault.save("c/refused", {"f": b"payload"})
    with pytest.raises(NotFound):
        vault._run(vault.aio._download(ckpt, "g", ckpt.files["f"], tmp_path / "g", _NoBar()))
    assert not list(tmp_path.iterdir())
    vault.load("c/refused", ckpt.id, tmp_path)  # the kept-alive connection still works
    assert (tmp_path / "f").read_bytes() == b"payload"


class _NoBar:
    def update(self, n: int) -> None:
        pass
