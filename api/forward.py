"""A worker's way to the process that writes: changes are forwarded, reads stay here.

Several server processes answer on one port (api/workers.py). LMDB lets every one of them
read the data dir's maps, but only one may write it: the writer's group commit, the save
journal and the syncer's recovery all assume a single writing process. So a worker answers
reads itself (records, listings, manifests, files, health) and passes everything else, as
it came, to the writing process over the engine socket (`Settings.engine_socket`, mode
0600 in the data dir): every change, plus the admin reads whose figures live in that
process (statistics, metrics, jobs, the audit log, replication).

The forwarded request keeps its method, target, headers and body (streamed both ways);
the writing process authenticates it as if it had come straight, and learns the caller's
address from `FORWARDED_FOR`, which it believes only on the engine socket from one of its
workers (`trusted_forwards`; api/peercred.py). A descriptor
hand-over cannot be forwarded (the descriptor travels on the local socket itself) and is
refused here with the reason.

Nothing reaches the writing process unauthenticated or uncounted: the worker authenticates
(and charges the token's rate) before forwarding, and each token may have
`forwards_per_token` requests passing to the writing process at once, the worker
`forwards_per_worker` in all; past them 429 / 503 with Retry-After and the connection
closes (its body unread). A small body is read whole here first, at `body_min_rate`, so a
client dripping it holds this process's connection, never one of the writer's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Collection

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Middleware
from checkpoint_vault.node.handoff import HANDOFF_MIN, can_hand_over, hand_over
from checkpoint_vault.node.peercred import is_worker, peer_of

from checkpoint_vault.protocol import DESCRIPTOR_TYPE
from checkpoint_vault.vault import InvalidRequest, Unavailable

from .auth import principal
from .errors import ApiError, Handler
from .observability import request_id
from .ratelimit import RateLimited
from .transfer.bodies import MinRateBody, Shares

FORWARDED_FOR = "X-Ckpt-Forwarded-For"
_READS = frozenset({"GET", "HEAD", "OPTIONS"})
# Reads whose answer is the writing process's own state (its counters, jobs, queue).
_WRITER_READS = ("/metrics", "/v1/stats", "/v1/admin/")
# Connection-scoped headers (RFC 9110 7.6.1), and what each side sets for itself.
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "expect",
        "host",
        "content-length",
        "date",
        "server",
        FORWARDED_FOR.lower(),
    }
)
PIECE = 1 << 20
# POST: one-request saves, one or several (api/routes/saves.py)
SAVE_ROUTES = frozenset({"/v1/namespaces/{ns}/checkpoints", "/v1/saves"})
CONNECT_WAIT, CONNECT_RETRY = 10.0, 0.05  # seconds
BUSY_RETRY_AFTER = 1  # seconds: a forward's time, not a recovery's


class Busy(ApiError):
    """This worker passes `forwards_per_worker` requests to the writing process already."""

    code = "unavailable"
    close_connection = True  # its body is unread: aiohttp would linger on it

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.retry_after = BUSY_RETRY_AFTER


class ForwardBounds:
    """How many requests a worker passes to the writing process at once: `per_token` per
    token name, `per_worker` in all; and how slowly a body it reads first may arrive."""

    def __init__(self, per_token: int, per_worker: int, idle: float, rate: int) -> None:
        self.per_token, self.per_worker = per_token, per_worker
        self.idle, self.rate = idle, rate
        self.shares = Shares()
        self.held = 0

    def take(self, name: str) -> None:
        """One more for `name`, or 429 (its share) / 503 (the worker's); give it back."""
        if self.held >= self.per_worker:
            raise Busy(
                f"this server process passes {self.per_worker} requests to the one that "
                "writes already; retry shortly"
            )
        if not self.shares.take(name, self.per_token):
            refused = RateLimited(
                f"token {name!r} has {self.per_token} changes in flight on this server "
                "process already; retry once one is answered",
                retry_after=BUSY_RETRY_AFTER,
            )
            refused.close_connection = True
            raise refused
        self.held += 1

    def give_back(self, name: str) -> None:
        self.held -= 1
        self.shares.give_back(name)


def forwarded(request: web.Request) -> bool:
    """Whether this request belongs to the process that writes. One-request saves do
    not: the worker prepares them and hands the writer only that (api/calls.py)."""
    if request.method in _READS:
        return request.path.startswith(_WRITER_READS)
    if request.method == "POST":
        resource = request.match_info.route.resource
        return resource is None or resource.canonical not in SAVE_ROUTES
    return True


class Forwarder:
    """One keep-alive connection pool to the writing process, for the worker's life."""

    def __init__(self, socket_path: str, handoff_path: str, bounds: ForwardBounds) -> None:
        self._handoff = handoff_path
        self.bounds = bounds
        self._session = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=socket_path, limit=0),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        )

    async def close(self) -> None:
        await self._session.close()

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        if request.content_type == DESCRIPTOR_TYPE:
            raise InvalidRequest("a file descriptor can only be handed over on the local socket")
        name = principal(request).name
        self.bounds.take(name)
        try:
            if can_hand_over(request):  # a large body: the connection goes, not the bytes
                return await hand_over(request, self._handoff)
            return await self._forward(request)
        finally:
            self.bounds.give_back(name)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        headers[FORWARDED_FOR] = request.remote or ""
        headers["X-Request-Id"] = request_id(request)
        length = request.content_length
        if length is not None:
            headers["Content-Length"] = str(length)
        body: bytes | AsyncIterator[bytes] | None = None
        if request.body_exists:
            reader = MinRateBody(request.content, self.bounds.idle, self.bounds.rate)
            if length is not None and length < HANDOFF_MIN:
                body = await _whole(reader, length)  # before the writer's descriptor is taken
            else:  # no length, or a large one over TLS: streamed as it comes
                body = _pieces(reader)
        upstream = await self._send(request, headers, body)
        async with upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in _HOP:
                    response.headers.add(key, value)
            if upstream.content_length is not None:
                response.content_length = upstream.content_length
            await response.prepare(request)
            async for piece in upstream.content.iter_chunked(PIECE):
                await response.write(piece)
            await response.write_eof()
        return response

    async def _send(
        self,
        request: web.Request,
        headers: dict[str, str],
        body: bytes | AsyncIterator[bytes] | None,
    ) -> aiohttp.ClientResponse:
        """Send, waiting up to CONNECT_WAIT for the engine socket to accept: it starts
        listening just after the workers start, and nothing was sent while it refuses."""
        deadline = time.monotonic() + CONNECT_WAIT
        while True:
            try:
                return await self._session.request(
                    request.method,
                    f"http://engine{request.rel_url}",
                    headers=headers,
                    data=body,
                    allow_redirects=False,
                )
            except aiohttp.ClientConnectorError as e:
                if time.monotonic() > deadline:
                    raise Unavailable(
                        f"the server process that writes is not reachable ({e}); retry shortly"
                    ) from None
                await asyncio.sleep(CONNECT_RETRY)
            except aiohttp.ClientConnectionError as e:
                raise Unavailable(
                    f"the server process that writes went away ({e}); retry shortly"
                ) from None


async def _whole(reader: MinRateBody, length: int) -> bytes:
    """A body of `length` bytes, read whole (at the minimum rate), or 400 if it ends short
    (sent on, the writing process would wait for the rest under its Content-Length)."""
    parts: list[bytes] = []
    got = 0
    while got < length and (piece := await reader.read(length - got)):
        parts.append(piece)
        got += len(piece)
    if got < length:
        raise InvalidRequest("body ended before its Content-Length")
    return b"".join(parts)


async def _pieces(reader: MinRateBody) -> AsyncIterator[bytes]:
    while piece := await reader.read(PIECE):
        yield piece


def forward_middleware(key: web.AppKey[Forwarder]) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if forwarded(request):
            return await request.app[key](request)
        return await handler(request)

    return middleware


def trusted_forwards(
    engine_socket: str, workers: Callable[[web.Application], Collection[int]]
) -> Middleware:
    """The writing process's side: a request that came on the engine socket from one of
    its current workers (`workers`: their pids; the kernel names the peer, api/peercred.py)
    was forwarded by it, so its caller's address is the one the worker names. Anywhere else
    the header is the caller's own word: dropped. Decided per connection: the same server
    also answers the local socket and the client connections workers hand over."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        named = request.headers.get(FORWARDED_FOR)
        if named is None:
            return await handler(request)
        transport = request.transport
        if (
            transport is not None
            and transport.get_extra_info("sockname") == engine_socket
            and is_worker(peer_of(transport.get_extra_info("socket")), workers(request.app))
        ):
            request = request.clone(remote=named) if named else request
        else:
            headers = request.headers.copy()
            del headers[FORWARDED_FOR]
            request = request.clone(headers=headers)
        return await handler(request)

    return middleware
