"""HTTP for the client: one pooled aiohttp session, the one retry policy, error mapping,
byte counts.

Every request the client makes is idempotent (chunk ids are content hashes, commits of one
upload return one checkpoint, one-request saves carry an idempotency key, reads resume by
Range), so every call goes through one loop, `Transport.retrying`, under one
`RetryPolicy`: connection errors, timeouts and 502/503/504 are retried, and 429 when it
says when (Retry-After); waits grow exponentially with full jitter, never shorter than a
Retry-After, and stop at the policy's attempt count or deadline.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import random
import ssl
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

from . import bulkget
from .errors import ClientError, TransportError, error_from
from .models import Transfer

T = TypeVar("T")
RETRY_STATUSES = frozenset({502, 503, 504})  # retried whether or not they say when
_WHOLE_BODY_LIMIT = 1 << 20
READ_BUFFER = 4 << 20  # a response may buffer this much before aiohttp pauses the socket:
# large reads then come in a few pieces, not one per 64 KiB
_NETWORK = (
    aiohttp.ClientConnectionError,
    aiohttp.ClientPayloadError,
    asyncio.TimeoutError,
    bulkget.Broken,
)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long a call is tried. `attempts` bounds the tries (1: never
    retry); `deadline` (seconds from the first try, None: no bound) stops retrying when
    the next wait would pass it. Waits: uniform in [0, min(cap, base * 2**n)] (full
    jitter), at least what a Retry-After asks; one asking longer than
    `retry_after_limit` seconds ends the call at once (waiting less would only be
    refused again)."""

    attempts: int = 6
    base: float = 0.1  # seconds: the bound of the first wait, doubling each time
    cap: float = 5.0
    deadline: float | None = None
    retry_after_limit: float = 60.0

    def delay(self, attempt: int) -> float:
        return random.uniform(0, min(self.cap, self.base * (2**attempt)))  # noqa: S311

    def wait(self, attempt: int, elapsed: float, retry_after: float | None) -> float | None:
        """Seconds to wait before try `attempt + 1` (counting from 0), or None: give up."""
        if attempt + 1 >= self.attempts:
            return None
        if retry_after is not None and retry_after > self.retry_after_limit:
            return None
        wait = max(self.delay(attempt), retry_after or 0.0)
        if self.deadline is not None and elapsed + wait > self.deadline:
            return None
        return wait


def retryable(error: BaseException) -> bool:
    """What can succeed when asked again: the network failed, or the server said so."""
    if isinstance(error, _NETWORK):
        return True
    if isinstance(error, ClientError) and error.status is not None:
        return error.status in RETRY_STATUSES or (
            error.status == 429 and error.retry_after is not None
        )
    return False


class Transport:
    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        retry: RetryPolicy | None = None,
        connections: int = 8,
        timeout: float = 300.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self._tls = tls  # None: aiohttp's default, verifying against the system's CAs
        self.retry = retry or RetryPolicy()
        self.transfer = Transfer()
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._connections = connections
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._bulk_connections: bulkget.Connections | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                connector=aiohttp.TCPConnector(
                    limit=self._connections, ssl=self._tls if self._tls is not None else True
                ),
                read_bufsize=READ_BUFFER,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=self._timeout),
            )
        return self._session

    async def close(self) -> None:
        if self._bulk_connections is not None:
            self._bulk_connections.close()
            self._bulk_connections = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def retrying(self, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """`attempt()` until it succeeds, fails for good, or the policy says stop. The one
        retry loop of the client: every request goes through it."""
        started = time.monotonic()
        n = 0
        while True:
            try:
                return await attempt()
            except (*_NETWORK, ClientError) as e:
                if not retryable(e):
                    raise
                after = e.retry_after if isinstance(e, ClientError) else None
                wait = self.retry.wait(n, time.monotonic() - started, after)
                if wait is None:
                    if isinstance(e, ClientError):
                        raise
                    raise TransportError(f"{what}: {e!r} (after {n + 1} attempts)") from e
            self.transfer.retries += 1
            n += 1
            await asyncio.sleep(wait)

    async def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        data: bytes | Sequence[bytes | memoryview] | None = None,
        headers: dict[str, str] | None = None,
        params: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """Send with retries; return (status, body) of a success or raise its ClientError.

        `data` may be a list of parts, sent one after the other without joining them."""
        parts: Sequence[bytes | memoryview] | None
        if isinstance(data, (bytes, bytearray, memoryview)):
            parts = [data]
        elif data is not None:
            parts = data
        else:
            parts = [json.dumps(json_body).encode()] if json_body is not None else None
        size = sum(len(p) for p in parts) if parts is not None else 0
        hdrs = dict(headers or {})
        if json_body is not None:
            hdrs.setdefault("Content-Type", "application/json")
        if parts is not None:  # streamed bodies would otherwise go chunked
            hdrs["Content-Length"] = str(size)

        async def attempt() -> tuple[int, bytes]:
            async with self._http().request(
                method, self.url + path, data=_payload(parts, size), headers=hdrs, params=params
            ) as resp:
                payload = await resp.read()
                self._count(size, len(payload))
                if resp.status >= 400:
                    raise _error(resp, payload)
                return resp.status, payload

        return await self.retrying(f"{method} {path}", attempt)

    async def json(self, method: str, path: str, **kwargs: Any) -> Any:
        _, payload = await self.request(method, path, **kwargs)
        return _parse(payload) if payload else None

    async def open_stream(
        self, path: str, headers: dict[str, str] | None = None
    ) -> aiohttp.ClientResponse:
        """A GET whose body the caller reads and then releases; retried until it answers."""
        return await self.retrying(f"GET {path}", lambda: self._open_once(path, headers))

    async def download(self, path: str, size: int, consume: Callable[[memoryview], None]) -> int:
        """The `size` bytes at `path`, in order, into `consume`, called on a thread: the body
        never passes through the event loop (client/bulkget.py). A connection that breaks
        (or a body that ends early) resumes with a Range request where it stopped, each
        resume one attempt of the policy. Returns the bytes received."""
        done = 0
        stop = threading.Event()  # set when the caller gives up: the thread stops too

        def counted(piece: memoryview) -> None:
            nonlocal done
            consume(piece)
            done += len(piece)
            self.transfer.bytes_received += len(piece)

        async def attempt() -> None:
            self.transfer.requests += 1
            await asyncio.to_thread(
                bulkget.receive, self._bulk(), path, self._headers, done, counted, _refusal, stop
            )
            if done < size:
                raise bulkget.Broken(f"body ended after {done} of {size} bytes")

        try:
            await self.retrying(f"GET {path}", attempt)
        finally:
            stop.set()
        return done

    def _bulk(self) -> bulkget.Connections:
        if self._bulk_connections is None:
            self._bulk_connections = bulkget.Connections(self.url, self._tls, self._timeout)
        return self._bulk_connections

    async def _open_once(self, path: str, headers: dict[str, str] | None) -> aiohttp.ClientResponse:
        self.transfer.requests += 1
        resp = await self._http().get(self.url + path, headers=headers)
        if resp.status >= 400:
            try:
                raise _error(resp, await resp.read())
            finally:
                resp.release()
        return resp

    def _count(self, sent: int, received: int) -> None:
        self.transfer.requests += 1
        self.transfer.bytes_sent += sent
        self.transfer.bytes_received += received


def _error(resp: aiohttp.ClientResponse, payload: bytes) -> ClientError:
    return _refusal(resp.status, resp.headers, payload)


def _refusal(status: int, headers: Mapping[str, str], payload: bytes) -> ClientError:
    error = error_from(status, _parse(payload))
    error.retry_after = _retry_after(headers)
    return error


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Retry-After in seconds (it may be a number or an HTTP date); None if absent."""
    value = headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _payload(
    parts: Sequence[bytes | memoryview] | None, size: int
) -> bytes | memoryview | AsyncIterator[bytes | memoryview] | None:
    """A small body goes whole; a large one (or many parts) as a stream of its parts, never
    joined: aiohttp warns that a large bytes body in one write can stall its event loop,
    and joining would copy every chunk once more."""
    if parts is None:
        return None
    if len(parts) == 1 and size <= _WHOLE_BODY_LIMIT:
        return parts[0]

    async def stream() -> AsyncIterator[bytes | memoryview]:
        for part in parts:
            view = memoryview(part)
            for i in range(0, len(view), _WHOLE_BODY_LIMIT):
                yield view[i : i + _WHOLE_BODY_LIMIT]

    return stream()


def _parse(payload: bytes) -> Any:
    try:
        return json.loads(payload)
    except ValueError:
        return None


__all__ = ["ClientError", "RetryPolicy", "Transport"]
