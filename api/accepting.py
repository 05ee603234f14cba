"""TCP connections past the descriptor bound, closed as they arrive.

Past RLIMIT_NOFILE, accept() itself failed with EMFILE, asyncio logged a traceback for each
try, and every request that needed a descriptor (a receiver's dup, an LMDB read, a log
file) failed too: 1,050 idle connections under a 1,024 limit made health take 70 s. So a
connection whose descriptor would leave fewer than `[server] spare_descriptors` under the
limit is closed at once (the client sees it reset and may retry). Linux gives a new
descriptor the lowest free number, so the number the connection got says how many are in
use: no count to keep.

The check runs when the connection is made, not inside accept(): uvloop (api/eventloop.py)
accepts in libuv, where no Python code runs, and a refused connection's descriptor is
only held for that moment either way. The refusals are logged a line a second at most.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import ssl
import time
from collections.abc import Callable
from typing import cast

from aiohttp import web

log = logging.getLogger("ckpt.api")


def descriptor_bound(spare: int) -> int:
    """The first descriptor number a connection may not have (`spare` kept under the
    process's soft limit)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 62 if soft == resource.RLIM_INFINITY else max(64, soft - spare)


class Refusals:
    """The bound of one process, and the connections it refused (logged at most once a
    second, with how many so far)."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.refused = 0
        self._logged_at = 0.0

    def admits(self, transport: asyncio.BaseTransport) -> bool:
        sock: socket.socket | None = transport.get_extra_info("socket")
        if sock is None or sock.fileno() < self.bound:
            return True
        self.refused += 1
        now = time.monotonic()
        if now - self._logged_at >= 1.0:
            self._logged_at = now
            log.warning(
                "connections refused: %d so far, descriptors %d and up are kept spare",
                self.refused,
                self.bound,
            )
        return False


class _Gate(asyncio.Protocol):
    """A new connection's first protocol: closes it past the bound, else hands it to the
    server's own protocol (aiohttp's request handler) before any byte is read."""

    def __init__(self, refusals: Refusals, protocol: Callable[[], asyncio.BaseProtocol]) -> None:
        self._refusals = refusals
        self._protocol = protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._refusals.admits(transport):
            cast(asyncio.Transport, transport).abort()  # (uvloop's is none of asyncio's classes)
            return
        handler = self._protocol()
        transport.set_protocol(handler)
        handler.connection_made(transport)


class BoundedSite(web.SockSite):
    """aiohttp's site on a listening socket, its connections through a `_Gate`."""

    def __init__(
        self,
        runner: web.BaseRunner,
        sock: socket.socket,
        refusals: Refusals,
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(runner, sock, ssl_context=ssl_context)
        self._refusals = refusals

    async def start(self) -> None:
        await web.BaseSite.start(self)  # what SockSite.start does, with the gate
        server = self._runner.server
        assert server is not None
        refusals = self._refusals
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Gate(refusals, server),
            sock=self._sock,
            ssl=self._ssl_context,
            backlog=self._backlog,
        )
