"""A stored file read by byte ranges: `RangeReader` decides how each read is fetched, and
two faces sit on it: `AsyncRemoteFile` (what `AsyncVaultClient.open` gives coroutines) and
the raw `RemoteFile` that `VaultClient.open` wraps in a BufferedReader.

Readers like `torch.load` go through a file mostly front to back, with small jumps: back a
few bytes to re-read a record header, forward past padding. So: a read where the last one
ended opens one streamed GET, and later reads up to `SKIP` bytes ahead continue it
(skipping the gap); the next piece is requested while the caller works on this one; a
re-read inside the piece handed out last comes from memory; anything else is one Range
request, which drops the stream. Every byte comes from one checkpoint id, fixed at open.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import Coroutine, Generator
from typing import Any

from .connections import Broken
from .loopthread import LoopThread
from .transport import Stream, Transport

PREFETCH = 4 << 20  # bytes per piece taken from the stream (one whole-file read: 3x slower)
SKIP = 1 << 20  # a forward jump this short reads over the gap rather than a new request
_EMPTY = memoryview(b"")


class Positioned:
    """Position bookkeeping of a read-only file of known size, for both faces here."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self._size = size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos


async def fetch_range(t: Transport, path: str, start: int, length: int) -> bytes:
    """`length` bytes of the file at `path` from `start` (fewer at its end): one request."""
    if length <= 0:
        return b""
    _, body = await t.request("GET", path, headers={"Range": f"bytes={start}-{start + length - 1}"})
    return body


class RangeReader:
    """The reads of one open file, on the client's loop (`buffered` from any thread)."""

    def __init__(self, t: Transport, path: str, size: int) -> None:
        self._t = t
        self._path = path
        self.size = size
        self._last_end = 0  # where the previous read stopped
        self._stream: Stream | None = None
        self._next = 0  # file offset of `_spare`'s first byte: what the stream gives next
        # Delivered by the stream, not yet read: a view, so taking a little from a large
        # piece copies only what is taken.
        self._spare = _EMPTY
        self._ahead: asyncio.Future[bytes] | None = None  # what follows `_spare`
        self._recent = b""  # the piece handed out last, for short backward re-reads
        self._recent_at = 0

    def buffered(self, pos: int, want: int) -> bytes | None:
        """A read that needs no I/O and starts nothing on the loop, else None: what a
        blocking caller tries before handing the read to the loop thread."""
        data = self._from_recent(pos, want)
        if data is None and pos == self._next and self._spare and self._ahead is not None:
            data, self._spare = bytes(self._spare[:want]), self._spare[want:]
            self._next += len(data)
            self._recent, self._recent_at = data, pos
        if data is not None:
            self._last_end = pos + len(data)
        return data

    async def read(self, pos: int, want: int) -> bytes:
        """Up to `want` bytes from `pos` (fewer at the end, or where a piece ends)."""
        want = min(want, self.size - pos)
        if want <= 0:
            return b""
        data = self._from_recent(pos, want)
        if data is None:
            data = await self._from_stream(pos, want)
            if data is None:  # not sequential, or the stream broke: a Range request (retried)
                await self.close()
                data = await fetch_range(self._t, self._path, pos, want)
            self._recent, self._recent_at = data, pos
        self._last_end = pos + len(data)
        return data

    @property
    def streaming(self) -> bool:
        """Whether `close` has anything to drop."""
        return self._stream is not None or self._ahead is not None

    async def close(self) -> None:
        """Drop the stream (the reader may read again: by Range, or a new stream)."""
        self._spare = _EMPTY
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            with contextlib.suppress(Exception):
                await ahead
        if self._stream is not None:
            stream, self._stream = self._stream, None
            stream.release()

    def _from_recent(self, pos: int, want: int) -> bytes | None:
        offset = pos - self._recent_at
        if 0 <= offset < len(self._recent):
            return self._recent[offset : offset + want]
        return None

    async def _from_stream(self, pos: int, want: int) -> bytes | None:
        try:
            if self._stream is None:
                if pos != self._last_end:
                    return None
                headers = {"Range": f"bytes={pos}-"} if pos else None
                self._stream = await self._t.open_stream(self._path, headers)
                self._next, self._spare = pos, _EMPTY
            gap = pos - self._next
            if not 0 <= gap <= SKIP:
                return None
            while gap:  # read over a short gap
                skipped = len(await self._take(gap))
                if not skipped:
                    return None
                gap -= skipped
            return await self._take(want) or None
        except Broken:
            return None

    async def _take(self, n: int) -> bytes:
        """Up to n bytes from the stream (fewer if fewer are ready, b"" at its end); asks
        for the next piece at once, so the transfer overlaps the caller's work."""
        assert self._stream is not None
        if not self._spare and self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            self._spare = memoryview(await ahead)
        if not self._spare:
            self._spare = memoryview(await self._stream.read(min(n, PREFETCH)))
        data, self._spare = bytes(self._spare[:n]), self._spare[n:]
        self._next += len(data)
        if data and self._ahead is None and self._next + len(self._spare) < self.size:
            self._ahead = asyncio.ensure_future(self._stream.read(PREFETCH))
        return data


class AsyncRemoteFile(Positioned):
    """A stored file for coroutines: `await read(n)`, `seek`, `tell`, `async with`."""

    def __init__(self, reader: RangeReader, name: str) -> None:
        super().__init__(reader.size)
        self._reader = reader
        self.name = name
        self.closed = False

    @property
    def size(self) -> int:
        return self._size

    async def read(self, size: int = -1) -> bytes:
        """`size` bytes from here (all the rest if negative), fewer only at the end."""
        if self.closed:
            raise ValueError("read of a closed file")
        want = self._size - self._pos if size < 0 else min(size, self._size - self._pos)
        parts: list[bytes] = []
        while want > 0:
            piece = await self._reader.read(self._pos, want)
            if not piece:
                break
            parts.append(piece)
            self._pos += len(piece)
            want -= len(piece)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self._reader.close()

    async def __aenter__(self) -> AsyncRemoteFile:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class OpeningFile:
    """What `AsyncVaultClient.open` returns: `await` it, or `async with` it."""

    def __init__(self, opening: Coroutine[Any, Any, AsyncRemoteFile]) -> None:
        self._opening = opening
        self._file: AsyncRemoteFile | None = None

    def __await__(self) -> Generator[Any, None, AsyncRemoteFile]:
        return self._opening.__await__()

    async def __aenter__(self) -> AsyncRemoteFile:
        self._file = await self._opening
        return self._file

    async def __aexit__(self, *exc: object) -> None:
        if self._file is not None:
            await self._file.close()


class SizedRawFile(Positioned, io.RawIOBase):
    """A read-only raw file of known size (RemoteFile here, torch's Segments)."""


class RemoteFile(SizedRawFile):
    """The blocking raw face: each read the reader cannot serve from memory runs on the
    client's loop thread."""

    def __init__(self, reader: RangeReader, loop: LoopThread, name: str) -> None:
        super().__init__(reader.size)
        self._reader = reader
        self._loop = loop
        self.name = name

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        want = min(len(view), self._size - self._pos)
        if want <= 0:
            return 0
        data = self._reader.buffered(self._pos, want)
        if data is None:
            data = self._loop.run(self._reader.read(self._pos, want))
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def readall(self) -> bytes:
        """The rest of the file in one read, not the default 8 KiB at a time."""
        out = bytearray(self._size - self._pos)
        n = 0
        while n < len(out):
            got = self.readinto(memoryview(out)[n:])
            if not got:
                break
            n += got
        return bytes(out[:n])

    def close(self) -> None:
        if not self.closed and self._reader.streaming:
            self._loop.run(self._reader.close())
        super().close()
