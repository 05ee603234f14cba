"""Streaming a file back: whole or one byte range, verified chunk by chunk.

Chunks are read in ~4 MiB batches on the worker pool, one batch ahead of the socket, so a
4 GiB download holds two batches in memory. If a chunk fails verification mid-stream the
connection is cut: the client sees a short body, never wrong bytes.

Bytes leave only from this process's memory. A batch of raw frames in the frame
environment (most hot data) is copied out of LMDB's data file with `preadv` into one of
two buffers the download reuses, under a read transaction that ends as soon as the copy
is made, and verified in the copy; then it is sent from there. It used to be sent from the
data file with sendfile, the transaction held until sendfile returned (issue 41): but a
TCP socket keeps *references* to the page-cache pages sendfile hands it, not copies, and
reads them when the bytes leave. Bytes still in the server's send queue (a client that
stops reading) or, on loopback, in the client's receive queue outlived the transaction,
LMDB reused the freed pages in place, and a client read another tenant's data. Holding
the transaction until the kernel lets go cannot be proven: SIOCOUTQ counts the send queue
only, and on loopback a byte leaves it when it reaches the receiver's queue, still a
reference to the same page. The copy costs one memcpy per byte (see docs/SECURITY.md).

The body leaves from a sender thread, not the event loop: the loop's way costs a selector
round (register, wait, unregister) each time the socket fills, every few hundred KiB on
loopback, which held the loop near a core for ~600 MB/s when it was asyncio's sendfile
(and a transport write also copies what does not fit into the transport's buffer). A sender
blocks in `poll` instead, on its own descriptor of the socket (a dup, so the transport
closing its own cannot hand the number to another file mid-send), while the loop serves
everything else; `send` copies the bytes into the kernel, so a buffer is free again when
its sender returns. The transport must hold no byte when a sender starts, so for the body
its high-water mark is 0: draining then means "empty". A client that takes nothing for
STALL_SECONDS is cut off (it resumes with a Range request) rather than holding a sender
and two buffers as long as it likes. Under TLS every byte passes through the transport,
which may keep a view of what it has not encrypted yet: buffers are not reused there.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import select
import socket
import threading
from collections.abc import Mapping

from aiohttp import web

from checkpoint_vault.protocol import DESCRIPTOR_TYPE
from checkpoint_vault.vault import FileEntry, InvalidRequest, NotFound, StoredCheckpoint, Vault
from checkpoint_vault.vault.content.reader import CopyBuffers, batches

from ..errors import InvalidRange
from ..http import json_response, run
from ..keys import RUNTIME, VAULT
from .promotion import PROMOTIONS
from .receive import with_descriptor

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
STALL_SECONDS = 10.0  # longest a client may take nothing before it is cut off
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


def _entry(
    request: web.Request, record: StoredCheckpoint, files: Mapping[str, FileEntry], name: str
) -> FileEntry:
    """The file asked for; a read of it counts towards promoting its checkpoint."""
    entry = files.get(name)
    if entry is None:
        raise NotFound(f"checkpoint {record.id} has no file {name!r}")
    if request.method == "GET":
        request.app[PROMOTIONS].after_read(request.app, record)
    return entry


async def stream_file(request: web.Request, ns: str, ref: str, name: str) -> web.StreamResponse:
    record, files = await run(request, request.app[VAULT].manifest, ns, ref)
    return await stream_entry(request, record, files, name)


async def stream_entry(
    request: web.Request, record: StoredCheckpoint, files: Mapping[str, FileEntry], name: str
) -> web.StreamResponse:
    """`stream_file` of a checkpoint the caller read already (`Vault.manifest`): the files
    route resolves it once, for the part's node and for this."""
    vault = request.app[VAULT]
    entry = _entry(request, record, files, name)
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
    transport = request.transport
    copies = CopyBuffers(reuse=transport is not None and not _encrypted(transport))
    # The first batch is read before the status goes out, so a tier that is down or a
    # corrupt first chunk still gets its proper JSON error (503, 500) instead of a 200
    # cut short; later failures can only cut the connection.
    batch = await _read(request, groups[0], copies)
    try:
        await resp.prepare(request)
        await _send_all(request, resp, groups, batch, copies, (spans[0][1], first, last))
    except BaseException:
        # The status is out: a cut connection is the only honest signal left (the client
        # sees a short body and resumes, or reports it).
        if request.transport is not None:
            request.transport.abort()
        raise
    await resp.write_eof()
    return resp


async def _send_all(
    request: web.Request,
    resp: web.StreamResponse,
    groups: list[list[bytes]],
    batch: Batch,
    copies: CopyBuffers,
    where: tuple[int, int, int],
) -> None:
    """Send every batch, the first (`batch`, already read) included, reading one ahead.
    `where`: the first batch's file offset and the range [first, last] asked for."""
    pos, first, last = where
    transport = request.transport
    if transport is None:
        raise ConnectionResetError("connection lost")
    low, high = transport.get_write_buffer_limits()
    if not _encrypted(transport):
        transport.set_write_buffer_limits(high=0)  # drain() waits for an empty buffer
    pending: asyncio.Future[Batch] | None = None
    try:
        for i in range(len(groups)):
            if i + 1 < len(groups):  # the next batch, into the other buffer
                pending = asyncio.ensure_future(_read(request, groups[i + 1], copies))
            pos = await _send(request, resp, batch, pos, first, last)
            if pending is not None:
                batch, pending = await pending, None
    finally:
        _drop(pending)
    transport.set_write_buffer_limits(high=high, low=low)


async def _deliver(request: web.Request, vault: Vault, entry: FileEntry) -> web.Response:
    """The whole file written into the one a client on this machine handed over, durably
    (vault/deliver.py); the answer says what was written."""
    if request.method != "GET" or "Range" in request.headers:
        raise InvalidRequest("a file handed over is written whole: GET, without Range")

    def deliver(fd: int, stop: threading.Event) -> None:
        vault.deliver_descriptor(entry, fd, stop)

    await with_descriptor(request, deliver, entry.size)
    return json_response({"size": entry.size, "hash": entry.hash.hex()})


Batch = list[bytes | memoryview]  # verified plaintexts, in the server's own memory


async def _read(request: web.Request, cids: list[bytes], copies: CopyBuffers) -> Batch:
    """A batch's verified plaintexts, raw hot frames copied out of the data file."""
    vault = request.app[VAULT]
    copied = await run(request, vault.reader.copied, cids, copies)
    if copied is not None:
        return copied
    return await run(request, vault.reader.chunks, cids)


async def _send(
    request: web.Request,
    resp: web.StreamResponse,
    batch: Batch,
    pos: int,
    first: int,
    last: int,
) -> int:
    """Send the part of `batch` inside [first, last]; `pos` is the batch's file offset.
    Returns the offset after it."""
    pieces: list[memoryview] = []
    for part in batch:
        lo, hi = max(first - pos, 0), min(last + 1 - pos, len(part))
        if hi > lo:
            pieces.append(memoryview(part)[lo:hi])
        pos += len(part)
    transport = request.transport
    if transport is None:
        raise ConnectionResetError("connection lost")
    if _encrypted(transport):
        for piece in pieces:
            await asyncio.wait_for(resp.write(piece), STALL_SECONDS)
    else:
        await _send_from_thread(request, transport, pieces)
    return pos


def _encrypted(transport: asyncio.BaseTransport) -> bool:
    """TLS: every byte must pass through the transport, which encrypts it."""
    return transport.get_extra_info("ssl_object") is not None


async def _send_from_thread(
    request: web.Request, transport: asyncio.Transport, pieces: list[memoryview]
) -> None:
    """Returns once every byte of `pieces` is in the kernel (copied there by `send`), so
    their buffer may be refilled."""
    await request.writer.drain()  # what the transport holds goes first
    out: socket.socket = transport.get_extra_info("socket").dup()
    loop = asyncio.get_running_loop()
    sending = loop.run_in_executor(request.app[RUNTIME].send, _blocking_send, out, pieces)
    sending.add_done_callback(lambda _: out.close())
    try:
        await asyncio.shield(sending)
    except asyncio.CancelledError:
        _shut(out)  # the sender fails at its next write and lets go of the batch
        sending.add_done_callback(_retrieved)  # that failure is no news: not logged
        raise


def _blocking_send(out: socket.socket, pieces: list[memoryview]) -> None:
    """Write `pieces` to the (non-blocking) socket in order; wait in poll when it is full.
    A client that takes nothing for STALL_SECONDS is cut off."""
    poller = select.poll()
    poller.register(out, select.POLLOUT)
    for view in pieces:
        while view:
            try:
                sent = out.send(view)
            except BlockingIOError:
                if not poller.poll(STALL_SECONDS * 1000):
                    raise TimeoutError(f"client took nothing for {STALL_SECONDS:.0f} s") from None
                continue
            if sent == 0:
                raise ConnectionResetError("connection closed mid-body")
            view = view[sent:]


def _retrieved(done: asyncio.Future[None]) -> None:
    if not done.cancelled():
        done.exception()


def _shut(out: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already gone
        out.shutdown(socket.SHUT_RDWR)


def _drop(pending: asyncio.Future[Batch] | None) -> None:
    """Let go of a batch read ahead and never sent (its failure, if it failed, is not the
    one to report: the send's is)."""
    if pending is None:
        return
    if pending.done():
        if not pending.cancelled():
            pending.exception()  # retrieved: no "never retrieved" log
    else:
        pending.cancel()
