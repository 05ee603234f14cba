"""Streaming a file back: whole or one byte range, verified chunk by chunk.

Chunks are read in ~4 MiB batches on the worker pool, one batch ahead of the socket, so a
4 GiB download holds two batches in memory. If a chunk fails verification mid-stream the
connection is cut: the client sees a short body, never wrong bytes.

A batch of raw frames in the frame environment (most hot data) is not copied at all: it is
verified in LMDB's map and sent from the data file with sendfile, its read transaction held
until sent so no page it names can be reused in between. A client that makes no progress
for PIN_SECONDS is cut off (it resumes with a Range request) rather than holding those
pages, and map growth, for as long as it likes.

The body leaves from a sender thread, not the event loop: asyncio's sendfile costs a
selector round (register, wait, unregister) each time the socket fills, which on loopback
is every few hundred KiB, and that held the loop near a core for ~600 MB/s. A sender blocks
in `poll` instead, on its own descriptor of the socket (a dup, so the transport closing its
own cannot hand the number to another file mid-send), while the loop serves everything
else. The transport must hold no byte when a sender starts, so for the body its high-water
mark is 0: draining then means "empty".
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import select
import socket
import threading
from collections.abc import Callable
from typing import Any

from aiohttp import web

from protocol import DESCRIPTOR_TYPE
from vault import FileEntry, InvalidRequest, NotFound, Vault
from vault.content.reader import Pinned, batches

from .errors import InvalidRange
from .http import json_response, run
from .keys import RUNTIME, VAULT
from .promotion import PROMOTIONS
from .receive import with_descriptor

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
PIN_SECONDS = 10.0  # longest a client may make no progress while pages are held for it
_BEYOND = 1 << 63  # stands for any position written with more digits than a size can have


def _position(digits: str) -> int:
    """A Range number; past 18 digits it is beyond any file (and int() of 5,000 digits
    raises: Python caps int parsing at 4,300 digits, which used to answer 500)."""
    return int(digits) if len(digits) <= 18 else _BEYOND


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(first, last) inclusive, or None for the whole file. Only single ranges."""
    if header is None:
        return None
    m = _RANGE.fullmatch(header.strip())
    if not m or m.group(1) == m.group(2) == "":
        raise InvalidRange(f"unsupported Range {header[:100]!r}: use bytes=a-b, a- or -n")
    if m.group(1) == "":  # suffix: last n bytes
        n = _position(m.group(2))
        if n == 0 or size == 0:
            raise InvalidRange(f"range not satisfiable for a {size}-byte file")
        return max(0, size - n), size - 1
    first = _position(m.group(1))
    last = _position(m.group(2)) if m.group(2) else size - 1
    if first >= size or last < first:
        raise InvalidRange(f"range {first}-{last} not satisfiable for a {size}-byte file")
    return first, min(last, size - 1)


def _spans(entry: FileEntry, first: int, last: int) -> list[tuple[bytes, int, int]]:
    """The chunks overlapping [first, last], as (id, offset in file, length)."""
    return [(c, o, n) for c, o, n in entry.spans() if o <= last and o + n > first]


async def _entry(request: web.Request, ns: str, ref: str, name: str) -> FileEntry:
    """The file asked for; a read of it counts towards promoting its checkpoint."""
    record, files = await run(request, request.app[VAULT].manifest, ns, ref)
    entry = files.get(name)
    if entry is None:
        raise NotFound(f"checkpoint {record.id} has no file {name!r}")
    if request.method == "GET":
        request.app[PROMOTIONS].after_read(request.app, record)
    return entry


async def stream_file(request: web.Request, ns: str, ref: str, name: str) -> web.StreamResponse:
    vault = request.app[VAULT]
    entry = await _entry(request, ns, ref, name)
    if request.content_type == DESCRIPTOR_TYPE:
        return await _deliver(request, vault, entry)
    etag = f'"{entry.hash.hex()}"'
    headers = {"ETag": etag, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
    if request.headers.get("If-None-Match") == etag:
        return web.Response(status=304, headers=headers)
    rng = parse_range(request.headers.get("Range"), entry.size)
    first, last = rng if rng is not None else (0, entry.size - 1)
    resp = web.StreamResponse(status=206 if rng else 200, headers=headers)
    if rng is not None:
        resp.headers["Content-Range"] = f"bytes {first}-{last}/{entry.size}"
    resp.content_length = last - first + 1 if entry.size else 0
    if request.method == "HEAD" or entry.size == 0:
        await resp.prepare(request)
        await resp.write_eof()
        return resp
    spans = _spans(entry, first, last)
    groups = list(batches([(c, n) for c, _, n in spans]))
    # The first batch is read before the status goes out, so a tier that is down or a
    # corrupt first chunk still gets its proper JSON error (503, 500) instead of a 200
    # cut short; later failures can only cut the connection.
    loop = asyncio.get_running_loop()
    first_batch: asyncio.Future[Batch] = loop.create_future()
    first_batch.set_result(await _read(request, groups[0]))
    pending: asyncio.Future[Batch] | None = first_batch
    pos = spans[0][1]
    transport = request.transport
    try:
        await resp.prepare(request)
        if transport is None:
            raise ConnectionResetError("connection lost")
        low, high = transport.get_write_buffer_limits()
        if not _encrypted(transport):
            transport.set_write_buffer_limits(high=0)  # drain() waits for an empty buffer
        for i in range(len(groups)):
            assert pending is not None
            batch = await pending  # `_send` owns it from here: it releases it
            pending = None
            if i + 1 < len(groups):
                pending = asyncio.ensure_future(_read(request, groups[i + 1]))
            pos = await _send(request, resp, batch, pos, first, last)
        transport.set_write_buffer_limits(high=high, low=low)
    except BaseException:
        # The status is out: a cut connection is the only honest signal left (the client
        # sees a short body and resumes, or reports it).
        if transport is not None:
            transport.abort()
        raise
    finally:
        _drop(pending)
    await resp.write_eof()
    return resp


async def _deliver(request: web.Request, vault: Vault, entry: FileEntry) -> web.Response:
    """The whole file written into the one a client on this machine handed over, durably
    (vault/deliver.py); the answer says what was written."""
    if request.method != "GET" or "Range" in request.headers:
        raise InvalidRequest("a file handed over is written whole: GET, without Range")

    def deliver(fd: int, stop: threading.Event) -> None:
        vault.deliver_descriptor(entry, fd, stop)

    await with_descriptor(request, deliver, entry.size)
    return json_response({"size": entry.size, "hash": entry.hash.hex()})


Batch = Pinned | list[bytes | memoryview]


async def _read(request: web.Request, cids: list[bytes]) -> Batch:
    """A batch as pinned stretches of the data file (raw hot frames), else as plaintexts."""
    vault = request.app[VAULT]
    pinning = asyncio.ensure_future(run(request, vault.pinned_chunks, cids))
    try:
        pinned = await asyncio.shield(pinning)
    except asyncio.CancelledError:
        pinning.add_done_callback(_release_result)  # the worker still finishes its pin
        raise
    if pinned is not None:
        return pinned
    return await run(request, vault.read_chunks, cids)


async def _send(
    request: web.Request,
    resp: web.StreamResponse,
    batch: Batch,
    pos: int,
    first: int,
    last: int,
) -> int:
    """Send the part of `batch` inside [first, last]; `pos` is the batch's file offset.
    Returns the offset after it. The batch's pin is released once it is sent or failed,
    even if this coroutine is cancelled first."""
    pieces: list[Piece] = []
    parts = batch.parts if isinstance(batch, Pinned) else batch
    for part in parts:
        n = part[1] if isinstance(part, tuple) else len(part)
        lo, hi = max(first - pos, 0), min(last + 1 - pos, n)
        if hi <= lo:
            pass
        elif isinstance(part, tuple):
            pieces.append((part[0] + lo, hi - lo))
        else:
            pieces.append(memoryview(part)[lo:hi])
        pos += n
    transport = request.transport
    if transport is None:
        _release(batch)
        raise ConnectionResetError("connection lost")
    if _encrypted(transport):
        await _send_through_transport(resp, transport, batch, pieces)
    else:
        await _send_from_thread(request, transport, batch, pieces)
    return pos


def _encrypted(transport: asyncio.BaseTransport) -> bool:
    """TLS: every byte must pass through the transport, which encrypts it."""
    return transport.get_extra_info("ssl_object") is not None


async def _send_through_transport(
    resp: web.StreamResponse, transport: asyncio.Transport, batch: Batch, pieces: list[Piece]
) -> None:
    """The event loop's way, for TLS (asyncio's sendfile reads and encrypts there)."""
    loop = asyncio.get_running_loop()
    try:
        for piece in pieces:
            if isinstance(piece, tuple):
                assert isinstance(batch, Pinned)
                sendfile = loop.sendfile(transport, batch.file, piece[0], piece[1])
                await asyncio.wait_for(sendfile, PIN_SECONDS)
            else:
                await asyncio.wait_for(resp.write(piece), PIN_SECONDS)
    finally:
        _release(batch)


async def _send_from_thread(
    request: web.Request, transport: asyncio.Transport, batch: Batch, pieces: list[Piece]
) -> None:
    try:
        await request.writer.drain()  # what the transport holds goes first
        out: socket.socket = transport.get_extra_info("socket").dup()
    except BaseException:
        _release(batch)
        raise
    src = batch.file.fileno() if isinstance(batch, Pinned) else -1
    loop = asyncio.get_running_loop()
    sending = loop.run_in_executor(request.app[RUNTIME].send, _blocking_send, out, src, pieces)

    def done(_: asyncio.Future[None]) -> None:
        out.close()
        _release(batch)

    sending.add_done_callback(done)
    try:
        await asyncio.shield(sending)
    except asyncio.CancelledError:
        _shut(out)  # the sender fails at its next write and lets go of the batch
        sending.add_done_callback(_retrieved)  # that failure is no news: not logged
        raise


Piece = tuple[int, int] | memoryview  # a stretch of the data file, or bytes to send as they are


def _blocking_send(out: socket.socket, src: int, pieces: list[Piece]) -> None:
    """Write `pieces` to the (non-blocking) socket in order: (offset, length) stretches of
    the file `src` with sendfile, plaintexts as they are; wait in poll when it is full."""
    poller = select.poll()
    poller.register(out, select.POLLOUT)
    fd = out.fileno()
    for piece in pieces:
        if isinstance(piece, tuple):
            offset, count = piece
            while count:
                sent = _attempt(poller, functools.partial(os.sendfile, fd, src, offset, count))
                offset += sent
                count -= sent
        else:
            view = piece
            while view:
                view = view[_attempt(poller, functools.partial(out.send, view)) :]


def _attempt(poller: select.poll, write: Callable[[], int]) -> int:
    """Bytes one write took; 0 after waiting for room. A client that takes nothing for
    PIN_SECONDS is cut off."""
    try:
        sent = write()
    except BlockingIOError:
        if not poller.poll(PIN_SECONDS * 1000):
            raise TimeoutError(f"client took nothing for {PIN_SECONDS:.0f} s") from None
        return 0
    if sent == 0:
        raise ConnectionResetError("connection closed mid-body")
    return sent


def _retrieved(done: asyncio.Future[None]) -> None:
    if not done.cancelled():
        done.exception()


def _shut(out: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already gone
        out.shutdown(socket.SHUT_RDWR)


def _release(batch: Batch) -> None:
    if isinstance(batch, Pinned):
        batch.release()


def _drop(pending: asyncio.Future[Batch] | None) -> None:
    """Let go of a batch read ahead and never sent."""
    if pending is None:
        return
    if pending.done():
        _release_result(pending)
    else:
        pending.cancel()


def _release_result(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is None:
        _release(future.result())
