"""Streaming a file back: whole or one byte range, verified chunk by chunk.

Chunks are read in ~4 MiB batches on the worker pool, one batch ahead of the socket, so a
4 GiB download holds two batches in memory. If a chunk fails verification mid-stream the
connection is cut: the client sees a short body, never wrong bytes.

A batch of raw frames in the frame environment (most hot data) is not copied at all: it is
verified in LMDB's map and sent from the data file with sendfile, its read transaction held
until sent so no page it names can be reused in between. A client that stalls longer than
PIN_SECONDS on one chunk is cut off (it resumes with a Range request) rather than holding
those pages, and map growth, for as long as it likes.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from aiohttp import web

from vault import FileEntry, NotFound
from vault.content.reader import Pinned, batches

from .errors import InvalidRange
from .http import run
from .keys import VAULT
from .promotion import PROMOTIONS

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
PIN_SECONDS = 10.0  # longest one chunk may take to reach a client while its pages are held
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


async def stream_file(request: web.Request, ns: str, ref: str, name: str) -> web.StreamResponse:
    vault = request.app[VAULT]
    record, files = await run(request, vault.manifest, ns, ref)
    entry = files.get(name)
    if entry is None:
        raise NotFound(f"checkpoint {record.id} has no file {name!r}")
    if request.method == "GET":
        request.app[PROMOTIONS].after_read(request.app, record)
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
    pending: asyncio.Future[Batch] = loop.create_future()
    pending.set_result(await _read(request, groups[0]))
    await resp.prepare(request)
    pos = spans[0][1]
    try:
        for i in range(len(groups)):
            batch = await pending
            if i + 1 < len(groups):
                pending = asyncio.ensure_future(_read(request, groups[i + 1]))
            pos = await _send(request, resp, batch, pos, first, last)
    except BaseException:
        # The status is out: a cut connection is the only honest signal left (the client
        # sees a short body and resumes, or reports it).
        if request.transport is not None:
            request.transport.abort()
        raise
    finally:
        _drop(pending)
    await resp.write_eof()
    return resp


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
    request: web.Request, resp: web.StreamResponse, batch: Batch, pos: int, first: int, last: int
) -> int:
    """Write the part of `batch` inside [first, last]; `pos` is the batch's file offset.
    Returns the offset after it."""
    if not isinstance(batch, Pinned):
        for data in batch:
            lo, hi = max(first - pos, 0), min(last + 1 - pos, len(data))
            await resp.write(memoryview(data)[lo:hi])
            pos += len(data)
        return pos
    loop = asyncio.get_running_loop()
    transport = request.transport
    try:
        if transport is None:
            raise ConnectionResetError("connection lost")
        for part in batch.parts:
            n = part[1] if isinstance(part, tuple) else len(part)
            lo, hi = max(first - pos, 0), min(last + 1 - pos, n)
            # Bounded: a client that stops reading must not hold the pages for long.
            if isinstance(part, tuple):
                if hi > lo:
                    sending = loop.sendfile(transport, batch.file, part[0] + lo, hi - lo)
                    await asyncio.wait_for(sending, PIN_SECONDS)
            elif hi > lo:
                await asyncio.wait_for(resp.write(memoryview(part)[lo:hi]), PIN_SECONDS)
            pos += n
    finally:
        batch.release()
    return pos


def _drop(pending: asyncio.Future[Batch]) -> None:
    """Let go of a batch read ahead and never sent."""
    if pending.done():
        _release_result(pending)
    else:
        pending.cancel()


def _release_result(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is None:
        result = future.result()
        if isinstance(result, Pinned):
            result.release()
