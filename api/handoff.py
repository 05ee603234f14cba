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
"""

from __future__ import annotations

import array
import asyncio
import logging
import os
import socket
from collections.abc import Callable
from typing import NoReturn

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from vault import Unavailable

from .observability import HANDED_OVER
from .peercred import WorkerPeers, worker_listener

log = logging.getLogger("ckpt.api")

HANDOFF_MIN = 1 << 20  # body bytes from which a connection is handed over, not forwarded
MAX_PREFIX = 4 << 20  # head and buffered body bytes one hand-over may carry
_BUFFER = MAX_PREFIX + 4096


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

    def __init__(self, inner: RequestHandler, prefix: bytes) -> None:
        self._inner = inner
        self._prefix = prefix

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)
        self._inner.data_received(self._prefix)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> None:
        self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class Adopter:
    """The writing process's side: takes connections on `path` into `server` (its aiohttp
    server: a new protocol per connection, as an accepted one gets)."""

    def __init__(self, path: str, server: Callable[[], RequestHandler], peers: WorkerPeers) -> None:
        """`peers`: the check that takes hand-overs from the writing process's workers
        only (anyone else could hand it a connection to serve as if a worker vouched)."""
        self._server = server
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
            client = socket.socket(fileno=fds[0])
            client.setblocking(False)
            task = self._loop.create_task(
                self._loop.connect_accepted_socket(lambda: _Replay(self._server(), prefix), client)
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            chan.send(b"1")
        except OSError as e:
            log.warning("a connection handed over by a worker was not taken: %s", e)
        finally:
            chan.close()
