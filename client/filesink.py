"""Writing a downloaded file at the speed of the disk.

A restore is done when the file is durable, so its time is the download plus the final
fsync. Left alone, the kernel starts writing a file back only when dirty pages pass a share
of RAM: all of a 1 GB file then waits for the fsync at the end, after the network is done.
`FileSink` asks for write-back of each stretch as soon as it is written
(`sync_file_range(SYNC_FILE_RANGE_WRITE)`, which only starts it), so the disk works while
the network delivers and the fsync waits for the tail. It is fed on a thread
(client/bulkget.py) while the next piece is received.

A large file goes to the disk with direct I/O when it can: a second descriptor of the
file opened with `O_DIRECT`, taking each piece that starts on a block boundary in the
file and in memory (bulkget's page-aligned buffers, filled whole but for the last, do,
unless a resumed download started off a boundary) as far as its last whole block; the
rest of such a piece, and any other piece, goes through the page cache at its offset
(a direct write starts only on a block boundary past everything written before, so the
two never share a block). Writing through the page cache (a page allocated and filled
for each 4 KiB, then written back) cost about as much CPU as receiving the bytes did,
and a download shares the machine's cores with the server and the process that waits
for it. A file system that refuses direct I/O gets every piece through the page cache.
A file written directly is not left in the page cache: whoever reads it next reads it
from the disk.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import sys
from pathlib import Path
from typing import IO, Any

import blake3

from checkpoint_vault.protocol import direct_safe

WRITEBACK_EVERY = 16 << 20  # bytes written between write-back requests
_SYNC_FILE_RANGE_WRITE = 2
ALIGN = 4096  # direct writes: offsets, lengths and buffer addresses in these units
DIRECT_MIN = 32 << 20  # smaller files go through the page cache


def _sync_file_range() -> Any:
    """libc's sync_file_range, or None where there is none (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    fn = getattr(ctypes.CDLL(None, use_errno=True), "sync_file_range", None)
    if fn is not None:
        fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    return fn


def _open_direct(path: Path) -> int | None:
    """A second descriptor of `path` for direct writes, or None where there is none."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | flag)
    except OSError:  # EINVAL: the file system has no direct I/O
        return None
    if direct_safe(fd):
        return fd
    os.close(fd)  # FUSE and the like may keep our reused buffers' pages (protocol/_direct.py)
    return None


def _aligned(piece: memoryview, pos: int) -> bool:
    """Whether `piece` may be written directly at `pos` as far as its last whole block:
    offset and address in whole blocks (a read-only buffer, whose address ctypes cannot
    take, may not)."""
    if pos % ALIGN or len(piece) < ALIGN or piece.readonly:
        return False
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(piece)) % ALIGN == 0
    except (TypeError, ValueError):
        return False


class FileSink:
    """Receives a file's pieces in order: writes, hashes, and starts their write-back.
    Blocking: called from one thread at a time. `direct`: the file's path, to write it
    with direct I/O where it can (a file of `size` bytes, at least DIRECT_MIN)."""

    def __init__(self, out: IO[bytes], direct: Path | None = None, size: int = 0) -> None:
        self._out = out
        self.hash = blake3.blake3(max_threads=blake3.blake3.AUTO)
        self._written = 0
        self._flushed = 0  # bytes whose write-back has been asked for
        self._range_sync = _sync_file_range()
        self._direct = _open_direct(direct) if direct and size >= DIRECT_MIN else None

    def write(self, piece: memoryview) -> None:
        direct = self._write_direct(piece)
        if direct < len(piece):
            _pwrite(self._out.fileno(), piece[direct:], self._written + direct)
        self.hash.update(piece)
        self._written += len(piece)
        if self._range_sync is not None and self._written - self._flushed >= WRITEBACK_EVERY:
            self._range_sync(
                self._out.fileno(),
                self._flushed,
                self._written - self._flushed,
                _SYNC_FILE_RANGE_WRITE,
            )
            self._flushed = self._written

    def _write_direct(self, piece: memoryview) -> int:
        """Write `piece` directly as far as its last whole block, if it starts on one: the
        bytes written (0: none, the caller writes them through the cache)."""
        if self._direct is None or not _aligned(piece, self._written):
            return 0
        whole = len(piece) - len(piece) % ALIGN
        try:
            _pwrite(self._direct, piece[:whole], self._written)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            self.close()  # this file system takes no direct write of this alignment
            return 0
        return whole

    def sync(self) -> None:
        """Make every written piece durable (fsync is the file's, whichever descriptor
        wrote it), and close the direct descriptor."""
        self._out.flush()
        os.fsync(self._out.fileno())
        self.close()

    def close(self) -> None:
        if self._direct is not None:
            fd, self._direct = self._direct, None
            with contextlib.suppress(OSError):
                os.close(fd)


def _pwrite(fd: int, piece: memoryview, pos: int) -> None:
    view = piece
    while view:
        n = os.pwrite(fd, view, pos)
        view = view[n:]
        pos += n
