"""Writing a downloaded file at the speed of the disk.

A restore is done when the file is durable, so its time is the download plus the final
fsync. Left alone, the kernel starts writing a file back only when dirty pages pass a share
of RAM: all of a 1 GB file then waits for the fsync at the end, after the network is done.
`FileSink` asks for write-back of each stretch as soon as it is written
(`sync_file_range(SYNC_FILE_RANGE_WRITE)`, which only starts it), so the disk works while
the network delivers and the fsync waits for the tail. It also hashes and writes on a worker
thread one piece behind the socket, so the event loop only receives.
"""

from __future__ import annotations

import asyncio
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
    """Receives a file's pieces in order: writes, hashes, and starts their write-back."""

    def __init__(self, out: IO[bytes]) -> None:
        self._out = out
        self.hash = blake3.blake3()
        self._pending: asyncio.Future[None] | None = None
        self._written = 0
        self._flushed = 0  # bytes whose write-back has been asked for
        self._range_sync = _sync_file_range()

    async def write(self, piece: bytes) -> None:
        """Queue `piece`; returns once the previous piece is written (one in flight)."""
        if self._pending is not None:
            await self._pending
        self._pending = asyncio.ensure_future(asyncio.to_thread(self._put, piece))

    async def close(self) -> None:
        """Wait for every piece, then make the file durable."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            await pending
        await asyncio.to_thread(self._sync)

    async def abandon(self) -> None:
        """Wait for the piece in flight (its thread still holds the file) without syncing."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            await asyncio.gather(pending, return_exceptions=True)

    def _put(self, piece: bytes) -> None:
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

    def _sync(self) -> None:
        self._out.flush()
        os.fsync(self._out.fileno())
