"""Streaming a file back: whole or one byte range, verified chunk by chunk.

Chunks are read in ~4 MiB batches on the worker pool, one batch ahead of the socket, so a
4 GiB download holds two batches in memory. If a chunk fails verification mid-stream the
connection is cut: the client sees a short body, never wrong bytes.
"""

from __future__ import annotations

import asyncio
import re

from aiohttp import web

from vault import FileEntry, NotFound
from vault.content.reader import batches

from .errors import InvalidRange
from .http import run
from .keys import VAULT
from .promotion import PROMOTIONS

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
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
    first_batch = await run(request, vault.read_chunks, groups[0])
    await resp.prepare(request)
    loop = asyncio.get_running_loop()
    next_batch: asyncio.Future[list[bytes | memoryview]] = loop.create_future()
    next_batch.set_result(first_batch)
    pos = spans[0][1]
    try:
        for i in range(len(groups)):
            datas = await next_batch
            if i + 1 < len(groups):
                next_batch = asyncio.ensure_future(run(request, vault.read_chunks, groups[i + 1]))
            for data in datas:
                lo = max(first - pos, 0)
                hi = min(last + 1 - pos, len(data))
                await resp.write(memoryview(data)[lo:hi])
                pos += len(data)
    finally:
        next_batch.cancel()
    await resp.write_eof()
    return resp
