"""Restoring into a handed-over file (vault/deliver.py): windows written side by side, a
large file with direct I/O on a local block file system. What lands must be the stored
file byte for byte and no larger on disk, whatever the windows' edges cut; a damaged chunk
anywhere fails the restore and is flagged; the descriptor's flags are the client's again
after; and a direct restore leaves the page cache alone (the CPU it saves is the page
cache's)."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import pytest

from checkpoint_vault.protocol import BLOCK_FILE_SYSTEMS, file_system_type
from checkpoint_vault.vault import ChunkCorrupt, StoredCheckpoint, Vault
from checkpoint_vault.vault import deliver as deliver_module

from ...pagecache import resident_pages
from .helpers import client_save, flip_last_byte

ALIGN = deliver_module.ALIGN
# Past the direct-I/O floor, the last window a partial one, the end on no block boundary;
# chunks of an odd size straddle every window's edge.
SIZE = deliver_module.DIRECT_MIN + deliver_module.WINDOW // 2 + 4097
CHUNK = 300_007


def _data(size: int) -> bytes:
    """Random stretches (raw frames) and zeros (zstd frames), alternating."""
    piece = 3 * CHUNK + 11
    out = bytearray()
    while len(out) < size:
        out += os.urandom(piece) if len(out) // piece % 3 else bytes(piece)
    return bytes(out[:size])


def _saved(vault: Vault, data: bytes) -> StoredCheckpoint:
    return client_save(vault, "ns", {"f": data}, chunk_size=CHUNK)


def _restore(vault: Vault, ref: str, out: Path) -> int:
    """Restore file f of `ref` into a new file at `out`; a descriptor of that same open
    file, kept here (the vault closes the one handed over), whose flags the test reads."""
    _, files = vault.manifest("ns", ref)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    mine = os.dup(fd)
    try:
        vault.deliver_descriptor(files["f"], fd)
    except BaseException:
        os.close(mine)
        raise
    return mine


def _places(tmp_path: Path) -> list[Path]:
    """tmp_path, and a tmpfs (no block file system: the page cache path) if there is one."""
    places = [tmp_path]
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        shm = Path("/dev/shm") / f"ckpt-test-{os.getpid()}-{tmp_path.name}"
        shm.mkdir()
        places.append(shm)
    return places


@pytest.mark.slow
def test_a_large_file_lands_whole_and_no_larger(vault: Vault, tmp_path: Path) -> None:
    data = _data(SIZE)
    rec = _saved(vault, data)
    for place in _places(tmp_path):
        out = place / "f.restored"
        try:
            _check_restored(vault, rec.id, out, data)
        finally:
            out.unlink(missing_ok=True)
            if place != tmp_path:
                place.rmdir()


def _check_restored(vault: Vault, ref: str, out: Path, data: bytes) -> None:
    mine = _restore(vault, ref, out)
    try:
        assert not fcntl.fcntl(mine, fcntl.F_GETFL) & os.O_DIRECT  # the client's flags
    finally:
        os.close(mine)
    assert out.read_bytes() == data, out
    st = out.stat()
    assert st.st_size == SIZE
    # No padding, no window's worth left allocated past the end: the size in whole
    # blocks, and at most a few blocks of an ext4 extent tree (windows written side
    # by side may land in several extents).
    assert st.st_blocks * 512 <= -(-SIZE // ALIGN) * ALIGN + 16 * ALIGN


@pytest.mark.slow
def test_a_damaged_chunk_fails_the_restore_and_is_flagged(vault: Vault, tmp_path: Path) -> None:
    data = _data(SIZE)
    rec = _saved(vault, data)
    _, files = vault.manifest("ns", rec.id)
    # A raw chunk in the third window, across nothing: two windows are written around it.
    at = 2 * deliver_module.WINDOW + CHUNK
    cids = [
        cid
        for cid, start, n in files["f"].spans()
        if start >= at and data[start : start + n] != bytes(n)
    ]
    damaged = cids[0]
    flip_last_byte(vault, damaged)
    out = tmp_path / "f.restored"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    mine = os.dup(fd)
    try:
        with pytest.raises(ChunkCorrupt):
            vault.deliver_descriptor(files["f"], fd)
        assert not fcntl.fcntl(mine, fcntl.F_GETFL) & os.O_DIRECT
    finally:
        os.close(mine)
    deadline = time.monotonic() + 10  # the flag is written by the writer thread
    while not _flagged(vault, damaged):
        assert time.monotonic() < deadline, "the damaged chunk was not flagged"
        time.sleep(0.01)


def _flagged(vault: Vault, cid: bytes) -> bool:
    with vault.store.catalog_env.read() as txn:
        meta = vault.store.chunks.meta(txn, cid)
    return meta is not None and meta.damaged


@pytest.mark.slow
def test_a_direct_restore_leaves_the_page_cache_alone(vault: Vault, tmp_path: Path) -> None:
    probe = os.open(tmp_path, os.O_RDONLY)
    try:
        kind = file_system_type(probe)
    finally:
        os.close(probe)
    if kind not in BLOCK_FILE_SYSTEMS:
        pytest.skip(f"{tmp_path} is on no local block file system (f_type {kind})")
    data = _data(SIZE)
    rec = _saved(vault, data)
    out = tmp_path / "f.restored"
    os.close(_restore(vault, rec.id, out))
    resident, pages = resident_pages(out)
    assert resident <= pages // 20  # through the page cache: every page


def test_copy_into_lays_the_chunks_end_to_end(vault: Vault) -> None:
    data = _data(5 * CHUNK + 123)  # raw frames and zstd ones
    rec = _saved(vault, data)
    _, files = vault.manifest("ns", rec.id)
    cids = [cid for cid, _ in files["f"].chunks]
    sizes = [n for _, n in files["f"].chunks]
    room = bytearray(len(data))
    vault.reader.copy_into(cids, sizes, memoryview(room))
    assert room == data
    with pytest.raises(ValueError, match="room"):
        vault.reader.copy_into(cids, sizes, memoryview(room)[1:])
