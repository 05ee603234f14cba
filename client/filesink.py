"""Writing a downloaded file at the speed of the disk.

A restore is done when the file is durable, so its time is the download plus the final
fsync. Left alone, the kernel starts writing a file back only when dirty pages pass a share
of RAM: all of a 1 GB file then waits for the fsync at the end, after the network is done.
`FileSink` asks for write-back of each stretch as soon as it is written
(`sync_file_range(SYNC_FILE_RANGE_WRITE)`, which only starts it), so the disk works while
the network delivers and the fsync waits for the tail. It is fed on a thread
(client/bulkget.py) while the next piece is received.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import IO, Any

import blake3

WRITEBACK_EVERY = 16 << 20  # bytes written between write-back requests
_SYNC_FILE_RANGE_WRITE = 2


def _sync_file_range() -> Any:
    """libc's sync_file_range, or None where there is none (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    fn = getattr(ctypes.CDLL(None, use_errno=True), "sync_file_range", None)
    if fn is not None:
        fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    return fn


class FileSink:
    """Receives a file's pieces in order: writes, hashes, and starts their write-back.
    Blocking: called from one thread at a time."""

    def __init__(self, out: IO[bytes]) -> None:
        self._out = out
        self.hash = blake3.blake3(max_threads=blake3.blake3.AUTO)
        self._written = 0
        self._flushed = 0  # bytes whose write-back has been asked for
        self._range_sync = _sync_file_range()

    def write(self, piece: memoryview) -> None:
        self._out.write(piece)
        self.hash.update(piece)
        self._written += len(piece)
        if self._range_sync is not None and self._written - self._flushed >= WRITEBACK_EVERY:
            self._out.flush()
            self._range_sync(
                self._out.fileno(),
                self._flushed,
                self._written - self._flushed,
                _SYNC_FILE_RANGE_WRITE,
            )
            self._flushed = self._written

    def sync(self) -> None:
        """Make every written piece durable."""
        self._out.flush()
        os.fsync(self._out.fileno())
