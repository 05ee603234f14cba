"""A stored file as a seekable, read-only raw file: what `VaultClient.open` wraps.

Readers like `torch.load` go through a file mostly front to back, with small jumps: back a
few bytes to re-read a record header, forward past padding. So: a read where the last one
ended opens one streamed GET, and later reads up to `SKIP` bytes ahead continue it
(skipping the gap); the next piece is requested while the caller works on this one; a
re-read inside the piece handed out last comes from memory; anything else is one Range
request, which drops the stream. Every byte comes from one checkpoint id, fixed at open.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import io
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp

if TYPE_CHECKING:
    from .aio import AsyncVaultClient

T = TypeVar("T")
PREFETCH = 4 << 20  # bytes per piece taken from the stream (one whole-file read: 3x slower)
SKIP = 1 << 20  # a forward jump this short reads over the gap rather than a new request


class SizedRawFile(io.RawIOBase):
    """A read-only raw file of known size: position bookkeeping for the readers here."""

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


class RemoteFile(SizedRawFile):
    def __init__(
        self,
        aio: AsyncVaultClient,
        loop: asyncio.AbstractEventLoop,
        where: tuple[str, str, str],  # namespace, checkpoint id, file name
        size: int,
    ) -> None:
        super().__init__(size)
        self._aio = aio
        self._loop = loop
        self._where = where
        self.name = where[2]
        self._last_end = 0  # where the previous read stopped
        self._stream: aiohttp.ClientResponse | None = None
        self._next = 0  # file offset of `_spare`'s first byte: what the stream gives next
        self._spare = b""  # delivered by the stream, not yet read
        self._ahead: concurrent.futures.Future[bytes] | None = None  # what follows `_spare`
        self._recent = b""  # the piece handed out last, for short backward re-reads
        self._recent_at = 0

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        want = min(len(view), self._size - self._pos)
        if want <= 0:
            return 0
        data = self._from_recent(want)
        if data is None:
            data = self._from_stream(want)
            if data is None:  # not sequential, or the stream broke: a Range request (retried)
                self._drop_stream()
                ns, cid, name = self._where
                data = self._run(self._aio.read_range(ns, cid, name, self._pos, want))
            self._recent, self._recent_at = data, self._pos
        view[: len(data)] = data
        self._pos += len(data)
        self._last_end = self._pos
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
        if not self.closed:
            self._drop_stream()
            self._recent = b""
        super().close()

    # -- sources ------------------------------------------------------------------------
    def _from_recent(self, want: int) -> bytes | None:
        offset = self._pos - self._recent_at
        if 0 <= offset < len(self._recent):
            return self._recent[offset : offset + want]
        return None

    def _from_stream(self, want: int) -> bytes | None:
        try:
            if self._stream is None:
                if self._pos != self._last_end:
                    return None
                ns, cid, name = self._where
                self._stream = self._run(self._aio.open_file(ns, cid, name, self._pos))
                self._next, self._spare = self._pos, b""
            gap = self._pos - self._next
            if not 0 <= gap <= SKIP:
                return None
            while gap:  # read over a short gap
                skipped = len(self._take(gap))
                if not skipped:
                    return None
                gap -= skipped
            return self._take(want) or None
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return None

    def _take(self, n: int) -> bytes:
        """Up to n bytes from the stream (fewer if fewer are ready, b"" at its end); asks
        for the next piece at once, so the transfer overlaps the caller's work."""
        assert self._stream is not None
        if not self._spare and self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            self._spare = ahead.result()
        if not self._spare:
            self._spare = self._run(_read_up_to(self._stream, min(n, PREFETCH)))
        data, self._spare = self._spare[:n], self._spare[n:]
        self._next += len(data)
        if data and self._ahead is None and self._next + len(self._spare) < self._size:
            self._ahead = asyncio.run_coroutine_threadsafe(
                _read_up_to(self._stream, PREFETCH), self._loop
            )
        return data

    def _drop_stream(self) -> None:
        self._spare = b""
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            with contextlib.suppress(Exception):
                ahead.result()
        if self._stream is not None:
            stream, self._stream = self._stream, None
            self._run(_release(stream))

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()


async def _read_up_to(resp: aiohttp.ClientResponse, n: int) -> bytes:
    """Up to n bytes of the body: fewer only at its end."""
    parts: list[bytes] = []
    got = 0
    while got < n:
        piece = await resp.content.read(n - got)
        if not piece:
            break
        parts.append(piece)
        got += len(piece)
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def _release(resp: aiohttp.ClientResponse) -> None:
    resp.release()
