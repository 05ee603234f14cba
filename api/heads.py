"""Connections that have not sent a whole request head yet, bounded per client address and
in all, so that idle connections of one client never keep another's out.

Such a connection costs a descriptor and nothing else until `header_timeout` closes it
(api/serve.py); 1,500 of them from one address left every worker resetting new connections
at its descriptor bound for those 30 s. The listening sockets (api/serve.py `_Listener`)
note each connection they accept here, with its address; its first request head takes it
off (`headed`, the first middleware). When an address holds `per_client` of them, or the
process `total`, the oldest (of that address, else of all) is shut for the new one if it
has waited `GRACE` at least: its client sees the connection end, as at the header
timeout, and may open another. A client sends its head right after connecting, so only
connections left idle on purpose lose theirs; the grace spares a burst of one client's
connections whose heads are parsed a few loop turns after the accept. A connection that
would pass the descriptor bound shuts the oldest of all, whatever its age (`make_room`),
instead of being refused. Connections closed meanwhile are forgotten lazily: their socket
object's number is then -1.
"""

from __future__ import annotations

import contextlib
import resource
import socket
import time
from collections import OrderedDict

from aiohttp import web
from aiohttp.typedefs import Middleware
from checkpoint_vault.node.handoff import RareLog

from .errors import Handler

GRACE = 1.0  # seconds a head-less connection is spared from the per-client and total bounds


class Unheaded:
    """This process's accepted TCP connections without a request head yet, by number."""

    def __init__(self, per_client: int, total: int, spare: int) -> None:
        """`total` is capped at half what the descriptor bound (RLIMIT_NOFILE less `spare`)
        leaves, so head-less connections never take the descriptors of the rest."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY:
            total = min(total, max(1, (soft - spare) // 2))
        self.total = total
        self.per_client = min(per_client, total)
        self._all: OrderedDict[int, str] = OrderedDict()  # number -> client address
        # client address -> number -> (socket, time.monotonic() of its accept)
        self._by_host: dict[str, OrderedDict[int, tuple[socket.socket, float]]] = {}
        self._closed = RareLog("connections without a request head closed for newer ones")

    def opened(self, sock: socket.socket, address: object) -> None:
        """A connection just accepted: room is made for it, then it is counted."""
        host = address[0] if isinstance(address, tuple) and address else ""
        fd, now = sock.fileno(), time.monotonic()
        self._forget(fd)  # a closed connection's entry under the same number
        if len(self._by_host.get(host, ())) >= self.per_client:
            self._prune(list(self._by_host[host]))
            if mine := self._by_host.get(host):
                self._shut(next(iter(mine)), now - GRACE, f"{host} holds {self.per_client}")
        if len(self._all) >= self.total:
            self._prune(list(self._all))
            if self._all:
                self._shut(next(iter(self._all)), now - GRACE, f"{self.total} in all")
        self._all[fd] = host
        self._by_host.setdefault(host, OrderedDict())[fd] = (sock, now)

    def make_room(self) -> bool:
        """Shut the oldest head-less connection, if any, for one past the descriptor bound."""
        while self._all:
            oldest = next(iter(self._all))
            if not self._stale(oldest):
                return self._shut(oldest, None, "descriptor bound")
            self._forget(oldest)
        return False

    def headed(self, request: web.Request) -> None:
        """The connection of `request` sent a whole head: no longer counted."""
        transport = request.transport
        sock = None if transport is None else transport.get_extra_info("socket")
        if sock is not None and sock.fileno() in self._all:
            self._forget(sock.fileno())

    def held(self) -> int:
        return len(self._all)

    def _stale(self, fd: int) -> bool:
        """Whether the connection counted under `fd` closed since (its socket's is -1)."""
        return self._by_host[self._all[fd]][fd][0].fileno() != fd

    def _prune(self, fds: list[int]) -> None:
        for fd in fds:
            if self._stale(fd):
                self._forget(fd)

    def _forget(self, fd: int) -> None:
        host = self._all.pop(fd, None)
        if host is None:
            return
        mine = self._by_host[host]
        del mine[fd]
        if not mine:
            del self._by_host[host]

    def _shut(self, fd: int, before: float | None, why: str) -> bool:
        """End the connection counted under `fd` if it was accepted before `before` (None:
        whenever): shut, not closed, as its transport owns the number (it sees the end,
        closes, and aiohttp forgets the connection)."""
        sock, at = self._by_host[self._all[fd]][fd]
        if before is not None and at > before:
            return False
        self._forget(fd)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        self._closed.note(why)
        return True


def headed_middleware(key: web.AppKey[Unheaded]) -> Middleware:
    """First of all: a request arrived, so its connection's head is whole."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        request.app[key].headed(request)
        return await handler(request)

    return middleware
