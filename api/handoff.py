"""Connections a worker hands to the writing process, whole, instead of forwarding a body.

A worker forwards a change to the process that writes (api/forward.py). For a large body
(a chunk batch, a streamed file) forwarding costs the service the body twice: the worker
receives it and sends it on, the writing process receives it again (measured: +1.3 s of
CPU per GB over one process). So for a body of `HANDOFF_MIN` bytes or more on plain HTTP,
the worker hands over the connection itself: the socket's descriptor (SCM_RIGHTS) with
the bytes it already took off it (the request head, rebuilt from the raw headers, and the
start of the body), on a SOCK_SEQPACKET socket in the data dir (`Settings.handoff_socket`,
one message each; mode 0600, and taken only from the writing process's own workers,
api/peercred.py). The writing process adopts the socket into its own aiohttp server,
replays those bytes first, and from then on the connection is its own: the client's later
requests on it (the next batches of an upload) go there directly, with no worker between.

The worker lets go of its copy without a word on the wire (closing one of two descriptors
of a socket sends nothing). A hand-over that fails after the bytes were taken is answered
503 with `Connection: close` (the client retries on a new connection).

The writing process bounds what it adopts (`Adopted`): `adopted_connections` at once and
`adopted_per_token` per token name; past the first it refuses the hand-over (the worker
answers 503), past the second it answers the connection's request 429 and closes it. A
connection that would leave it fewer than `spare_descriptors` descriptors is refused too,
and running out of descriptors (EMFILE) pauses its accepting for a second instead of
spinning: each of those is logged a line a second at most (`RareLog`). The first request
of an adopted connection was authenticated and charged by the worker; later ones on it
come straight here and are charged here.
"""

from __future__ import annotations

import array
import asyncio
import functools
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import NoReturn

from aiohttp import web
from aiohttp.typedefs import Middleware
from aiohttp.web_protocol import RequestHandler
from checkpoint_vault.node.peercred import WorkerPeers, worker_listener

from checkpoint_vault.vault import Unavailable

from .auth import principal
from .errors import Handler
from .observability import HANDED_OVER
from .ratelimit import RateLimited
from .transfer.bodies import Shares

log = logging.getLogger("ckpt.api")

HANDOFF_MIN = 1 << 20  # body bytes from which a connection is handed over, not forwarded
MAX_PREFIX = 4 << 20  # head and buffered body bytes one hand-over may carry
_BUFFER = MAX_PREFIX + 4096
PAUSE = 1.0  # seconds the adopter stops accepting after running out of descriptors
ADOPTED_RETRY_AFTER = 1  # seconds a token past its adopted share is told to wait
FIRST = web.RequestKey("adopted_first", bool)  # the request a worker handed over


class RareLog:
    """A warning logged a line a second at most, with how often it happened in all: a
    condition met per connection (descriptors running out) logged 6,120 lines before."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._count = 0
        self._at = -PAUSE

    def note(self, detail: object) -> None:
        self._count += 1
        now = time.monotonic()
        if now - self._at >= PAUSE:
            self._at = now
            log.warning("%s: %d so far (the latest: %s)", self._what, self._count, detail)


class Adopted:
    """The connections the writing process adopted and still holds, `total` at most and
    `per_token` per token name (counted from the first request's token, api/app.py).
    Counted on the event loop only."""

    def __init__(self, per_token: int, total: int) -> None:
        self.per_token, self.total = per_token, total
        self._open: set[RequestHandler] = set()
        self._fresh: set[RequestHandler] = set()  # whose first request has not come yet
        self._owner: dict[RequestHandler, str] = {}
        self._shares = Shares()

    def held(self) -> int:
        return len(self._open)

    def full(self) -> bool:
        return self.held() >= self.total

    def opened(self, handler: RequestHandler) -> None:
        self._open.add(handler)
        self._fresh.add(handler)

    def closed(self, handler: RequestHandler) -> None:
        self._open.discard(handler)
        self._fresh.discard(handler)
        owner = self._owner.pop(handler, None)
        if owner is not None:
            self._shares.give_back(owner)

    def marking(self) -> Middleware:
        """Before authentication: mark the request a worker handed over (it charged it)."""

        @web.middleware
        async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.protocol in self._fresh:
                self._fresh.discard(request.protocol)
                request[FIRST] = True
            return await handler(request)

        return middleware

    def counting(self) -> Middleware:
        """After authentication: count an adopted connection against its first request's
        token; past the token's share, 429 and the connection closes."""

        @web.middleware
        async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
            held = request.protocol
            if request.get(FIRST) and held in self._open and held not in self._owner:
                name = principal(request).name
                if not self._shares.take(name, self.per_token):
                    refused = RateLimited(
                        f"token {name!r} has {self.per_token} large-body connections held "
                        "by the server already; retry once one is done",
                        retry_after=ADOPTED_RETRY_AFTER,
                    )
                    refused.close_connection = True
                    raise refused
                self._owner[held] = name
            return await handler(request)

        return middleware


def can_hand_over(request: web.Request) -> bool:
    """A plain-HTTP request with a large body (TLS state cannot move between processes)."""
    transport = request.transport
    if transport is None or transport.get_extra_info("ssl_object") is not None:
        return False
    sock = transport.get_extra_info("socket")
    length = request.content_length
    return (
        sock is not None
        and sock.family in (socket.AF_INET, socket.AF_INET6)
        and length is not None
        and length >= HANDOFF_MIN
    )


async def hand_over(request: web.Request, path: str) -> web.StreamResponse:
    """The worker's side: give the connection to the writing process; answer nothing."""
    transport = request.transport
    assert transport is not None
    prefix = _head(request) + _taken_body(request)
    transport.pause_reading()
    if len(prefix) > MAX_PREFIX:
        _refuse(request, "the request head and body start are too large to hand over")
    loop = asyncio.get_running_loop()
    fd = os.dup(transport.get_extra_info("socket").fileno())
    chan = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        chan.setblocking(False)
        chan.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFFER)
        await loop.sock_connect(chan, path)
        chan.sendmsg([prefix], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
        ack = await asyncio.wait_for(loop.sock_recv(chan, 1), timeout=10)
    except (OSError, asyncio.TimeoutError) as e:
        _refuse(request, f"the server process that writes did not take it ({e})")
    finally:
        os.close(fd)
        chan.close()
    if ack != b"1":
        _refuse(request, "the server process that writes did not take it")
    request[HANDED_OVER] = True
    transport.abort()  # this process's descriptor only: the socket lives on over there
    return web.Response(status=204)  # never sent: the transport is gone


def _refuse(request: web.Request, why: str) -> NoReturn:
    """503, and the connection closes after it: its body was taken off it already."""
    request.protocol.close()
    raise Unavailable(f"{why}; retry")


def _head(request: web.Request) -> bytes:
    """The request head as the client sent it (aiohttp keeps the raw headers)."""
    version = f"HTTP/{request.version.major}.{request.version.minor}"
    lines = [f"{request.method} {request.raw_path} {version}".encode()]
    lines += [k + b": " + v for k, v in request.raw_headers]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _taken_body(request: web.Request) -> bytes:
    """What aiohttp already read of the body, taken from it (read until empty: each read
    may resume its parser, which hands over bytes it held back)."""
    parts = []
    while data := request.content.read_nowait(-1):
        parts.append(data)
    return b"".join(parts)


class _Replay(asyncio.Protocol):
    """aiohttp's protocol for an adopted connection, fed first the bytes the worker took."""

    def __init__(self, inner: RequestHandler, prefix: bytes, adopted: Adopted) -> None:
        self._inner = inner
        self._prefix = prefix
        self._adopted = adopted

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)
        self._inner.data_received(self._prefix)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> None:
        self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._adopted.closed(self._inner)
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


def _not_adopted(adopted: Adopted, handler: RequestHandler, task: asyncio.Task[object]) -> None:
    """A connection whose adoption failed is not held (counted from its hand-over on)."""
    if task.cancelled() or task.exception() is not None:
        adopted.closed(handler)


class Adopter:
    """The writing process's side: takes connections on `path` into `server` (its aiohttp
    server: a new protocol per connection, as an accepted one gets), as many as `adopted`
    allows and none numbered `bound` or above (descriptors kept spare)."""

    def __init__(
        self,
        path: str,
        server: Callable[[], RequestHandler],
        peers: WorkerPeers,
        adopted: Adopted,
        bound: int,
    ) -> None:
        """`peers`: the check that takes hand-overs from the writing process's workers
        only (anyone else could hand it a connection to serve as if a worker vouched)."""
        self._server = server
        self._adopted, self._bound = adopted, bound
        self._refused = RareLog("connections handed over by workers and not taken")
        self._loop = asyncio.get_running_loop()
        self._sock = worker_listener(path, peers, socket.SOCK_SEQPACKET, 64, _BUFFER)
        self._loop.add_reader(self._sock, self._accept)
        self._tasks: set[asyncio.Task[object]] = set()

    def close(self) -> None:
        self._loop.remove_reader(self._sock)
        self._sock.close()

    def _accept(self) -> None:
        try:
            chan, _ = self._sock.accept()
        except (BlockingIOError, ConnectionAbortedError):  # none, or one not from a worker
            return
        except OSError as e:  # EMFILE, ENFILE: left readable, the loop would spin on it
            self._loop.remove_reader(self._sock)
            self._loop.call_later(PAUSE, self._resume)
            self._refused.note(e)
            return
        chan.setblocking(False)
        self._loop.add_reader(chan, self._receive, chan)

    def _receive(self, chan: socket.socket) -> None:
        self._loop.remove_reader(chan)
        try:
            prefix, fds, _, _ = socket.recv_fds(chan, _BUFFER, 1)
            if len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                raise OSError("a hand-over without exactly one descriptor")
            if self._adopted.full() or fds[0] >= self._bound:
                os.close(fds[0])
                chan.send(b"0")  # the worker answers 503
                self._refused.note(f"{self._adopted.held()} held, descriptor {fds[0]}")
                return
            client = socket.socket(fileno=fds[0])
            client.setblocking(False)
            handler = self._server()
            self._adopted.opened(handler)  # now: the next hand-over may come before it runs
            replay = functools.partial(_Replay, handler, prefix, self._adopted)
            task = self._loop.create_task(self._loop.connect_accepted_socket(replay, client))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            task.add_done_callback(functools.partial(_not_adopted, self._adopted, handler))
            chan.send(b"1")
        except OSError as e:
            self._refused.note(e)
        finally:
            chan.close()

    def _resume(self) -> None:
        if self._sock.fileno() != -1:  # not closed meanwhile
            self._loop.add_reader(self._sock, self._accept)
