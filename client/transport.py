"""HTTP for the client: one pooled aiohttp session, retries, error mapping, byte counts.

Every request the client makes is idempotent (chunk ids are content hashes, commits of one
upload return one checkpoint, one-request saves carry an idempotency key), so connection
errors, timeouts and 502/503/504 are retried with exponential backoff and full jitter.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp

from .errors import ClientError, TransportError, Unavailable, error_from
from .models import Transfer

RETRY_STATUSES = frozenset({502, 503, 504})
_WHOLE_BODY_LIMIT = 1 << 20
READ_BUFFER = 4 << 20  # a response may buffer this much before aiohttp pauses the socket:
# large reads then come in a few pieces, not one per 64 KiB
_RETRYABLE = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError)


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6
    base: float = 0.1  # seconds before the first retry, doubling each time
    cap: float = 5.0

    def delay(self, attempt: int) -> float:
        return random.uniform(0, min(self.cap, self.base * (2**attempt)))  # noqa: S311


class Transport:
    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        retry: RetryPolicy | None = None,
        connections: int = 8,
        timeout: float = 300.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self.transfer = Transfer()
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._connections = connections
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=self._connections),
                read_bufsize=READ_BUFFER,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=self._timeout),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

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
        for attempt in range(self.retry.attempts):
            last = attempt == self.retry.attempts - 1
            try:
                async with self._http().request(
                    method,
                    self.url + path,
                    data=_payload(parts, size),
                    headers=hdrs,
                    params=params,
                ) as resp:
                    payload = await resp.read()
                    self._count(size, len(payload))
                    if resp.status in RETRY_STATUSES and not last:
                        await self._backoff(attempt)
                        continue
                    if resp.status >= 400:
                        raise error_from(resp.status, _parse(payload))
                    return resp.status, payload
            except _RETRYABLE as e:
                if last:
                    raise TransportError(f"{method} {path}: {e!r}") from e
                await self._backoff(attempt)
        raise Unavailable(f"{method} {path}: no answer after {self.retry.attempts} attempts")

    async def json(self, method: str, path: str, **kwargs: Any) -> Any:
        _, payload = await self.request(method, path, **kwargs)
        return _parse(payload) if payload else None

    @asynccontextmanager
    async def stream(
        self, path: str, headers: dict[str, str] | None = None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A GET whose body the caller reads; connection errors before the answer retry."""
        resp = await self.open_stream(path, headers)
        try:
            yield resp
        finally:
            resp.release()

    async def open_stream(
        self, path: str, headers: dict[str, str] | None = None
    ) -> aiohttp.ClientResponse:
        """`stream` for a caller that keeps the response across calls and releases it."""
        self.transfer.requests += 1
        for attempt in range(self.retry.attempts):
            try:
                resp = await self._http().get(self.url + path, headers=headers)
            except _RETRYABLE as e:
                if attempt == self.retry.attempts - 1:
                    raise TransportError(f"GET {path}: {e!r}") from e
                await self._backoff(attempt)
                continue
            if resp.status in RETRY_STATUSES and attempt < self.retry.attempts - 1:
                resp.release()
                await self._backoff(attempt)
                continue
            if resp.status >= 400:
                try:
                    raise error_from(resp.status, _parse(await resp.read()))
                finally:
                    resp.release()
            return resp
        raise Unavailable(f"GET {path}: no answer after {self.retry.attempts} attempts")

    def _count(self, sent: int, received: int) -> None:
        self.transfer.requests += 1
        self.transfer.bytes_sent += sent
        self.transfer.bytes_received += received

    async def _backoff(self, attempt: int) -> None:
        self.transfer.retries += 1
        await asyncio.sleep(self.retry.delay(attempt))


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
