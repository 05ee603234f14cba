"""Downloads written at the disk's speed (client/filesink.py): a large file over HTTP goes
to the disk with direct I/O where its pieces line up with blocks and through the page cache
where they do not; either way it lands byte for byte, no larger on disk, and a direct
download leaves the page cache alone (the CPU it saves is the page cache's)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import blake3
import pytest

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.filesink import ALIGN, DIRECT_MIN, FileSink

from ..pagecache import resident_pages
from ..serverproc import ServerProcess

SIZE = DIRECT_MIN + (3 << 20) + 4097  # past the floor; the end on no block boundary


def _blocks_fit(path: Path, size: int) -> bool:
    """The file's allocation is its size in whole blocks (and an extent tree's few)."""
    return path.stat().st_blocks * 512 <= -(-size // ALIGN) * ALIGN + 16 * ALIGN


@pytest.mark.slow
def test_a_large_download_goes_around_the_page_cache(
    vault: VaultClient, server: ServerProcess, tmp_path: Path
) -> None:
    data = os.urandom(SIZE)
    ckpt = vault.save("s/large", {"f.bin": data}, chunking="large")
    with VaultClient(server.url, server.token, progress=False, local_files=False) as http:
        http.load("s/large", ckpt.id, tmp_path / "out")
    out = tmp_path / "out" / "f.bin"
    resident, pages = resident_pages(out)  # before anything reads it back
    assert resident <= pages // 20  # through the page cache: every page
    assert out.stat().st_size == SIZE
    assert _blocks_fit(out, SIZE)
    assert out.read_bytes() == data


def test_pieces_off_the_blocks_go_through_the_page_cache(tmp_path: Path) -> None:
    """Pieces on block boundaries written directly up to their last whole block, the rest
    (their tails, pieces that start off a boundary, read-only bytes) at their offsets
    through the cache: the file is the pieces in order, its size theirs."""
    path = tmp_path / "f.part"
    buffers = [memoryview(mmap.mmap(-1, 4 << 20)) for _ in range(2)]
    expected = bytearray()
    with path.open("wb") as out:
        sink = FileSink(out, path, DIRECT_MIN)
        try:
            # whole; a block and 5 bytes (the 5 through the cache); 1000 bytes off the
            # boundary; back on it; whole; empty; read-only
            sizes = (4 << 20, ALIGN + 5, 1000, ALIGN - 1005, 4 << 20, 3 * ALIGN, 0, 777)
            for i, size in enumerate(sizes):
                buf = buffers[i % 2]
                buf[:size] = os.urandom(size)
                piece = buf[:size] if size != 777 else memoryview(bytes(buf[:size]))
                expected += piece
                sink.write(piece)
            sink.sync()
        finally:
            sink.close()
    assert path.stat().st_size == len(expected)
    assert path.read_bytes() == expected
    assert sink.hash.hexdigest() == blake3.blake3(expected).hexdigest()
