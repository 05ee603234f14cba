"""HTTP for the client: requests on a pool of threads over keep-alive connections
(client/connections.py), the one retry policy, error mapping, byte counts.

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
import functools
import http.client
import json
import random
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlencode, urlsplit

from . import bulkget, local
from . import connections as wire
from .connections import Broken
from .daemonpool import DaemonPool
from .endpoint import LOOPBACK
from .errors import ClientError, TransportError, error_from
from .models import Transfer

T = TypeVar("T")
RETRY_STATUSES = frozenset({502, 503, 504})  # retried whether or not they say when
_PATH_SAFE = "/%:@!$&'()*+,;=~"  # left as they are in a path: reserved or already escaped


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
    if isinstance(error, Broken):
        return True
    if isinstance(error, ClientError) and error.status is not None:
        return error.status in RETRY_STATUSES or (
            error.status == 429 and error.retry_after is not None
        )
    return False


class Transport:
    """Every request runs on one of `connections` threads (the bound on requests in
    flight, as a connection pool's would be) and is awaited on the caller's loop."""

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
        self.retry = retry or RetryPolicy()
        self.transfer = Transfer()
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        # tls None: https verifies against the system's CAs
        self._conns = wire.Connections(self.url, tls, timeout, keep=connections)
        self._threads = DaemonPool(connections, "ckpt-http")
        self._closed = False
        self._local: str | None = None  # `local_socket`: "" once known there is none

    async def close(self) -> None:
        """Close every connection (a request still running on a thread fails at once); the
        threads stop once their work has."""
        self._closed = True
        self._conns.close()
        self._threads.shutdown(wait=False)

    async def retrying(self, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """`attempt()` until it succeeds, fails for good, or the policy says stop. The one
        retry loop of the client: every request goes through it."""
        started = time.monotonic()
        n = 0
        while True:
            try:
                return await attempt()
            except (Broken, ClientError) as e:
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
        hdrs = {**self._headers, **(headers or {})}
        if json_body is not None:
            hdrs.setdefault("Content-Type", "application/json")
        if parts is not None:
            hdrs["Content-Length"] = str(size)
        target = self._target(path, params)
        call = functools.partial(wire.exchange, self._conns, method, target, hdrs, parts)

        async def attempt() -> tuple[int, bytes]:
            status, answer_headers, payload = await self._on_thread(call)
            self._count(size, len(payload))
            if status >= 400:
                raise _refusal(status, answer_headers, payload)
            return status, payload

        return await self.retrying(f"{method} {path}", attempt)

    async def json(self, method: str, path: str, **kwargs: Any) -> Any:
        _, payload = await self.request(method, path, **kwargs)
        return _parse(payload) if payload else None

    async def open_stream(self, path: str, headers: dict[str, str] | None = None) -> Stream:
        """A GET whose body the caller reads and then releases; retried until it answers."""
        hdrs = {**self._headers, **(headers or {})}
        ask = functools.partial(wire.ask, self._conns, "GET", self._target(path), hdrs)

        async def attempt() -> Stream:
            self.transfer.requests += 1
            conn, resp = await self._on_thread(ask)
            if resp.status >= 400:
                try:
                    payload = await self._on_thread(wire.read, resp, -1)
                finally:
                    wire.finish(self._conns, conn, resp)
                raise _refusal(resp.status, dict(resp.getheaders()), payload)
            return Stream(self, conn, resp)

        return await self.retrying(f"GET {path}", attempt)

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
            await self._on_thread(
                bulkget.receive,
                self._conns,
                self._target(path),
                self._headers,
                done,
                counted,
                _refusal,
                stop,
            )
            if done < size:
                raise Broken(f"body ended after {done} of {size} bytes")

        try:
            await self.retrying(f"GET {path}", attempt)
        finally:
            stop.set()
        return done

    async def local_socket(self) -> str | None:
        """The socket of the server this transport talks to, if it is on this machine and
        this process can use it (client/local.py); asked once, the answer kept."""
        if self._local is None:
            self._local = await self._find_local_socket() or ""
        return self._local or None

    async def _find_local_socket(self) -> str | None:
        url = urlsplit(self.url)
        if url.scheme != "http" or url.hostname not in LOOPBACK:
            return None
        try:
            health = await self.json("GET", "/v1/health")
        except (ClientError, TransportError):
            return None
        return await self._on_thread(local.socket_of, health, self._conns.timeout)

    async def hand_over(
        self, socket_path: str, path: str, file: Path, *, restore_size: int | None = None
    ) -> Any:
        """`PUT path` with the file `file` as its body, handed over open on the local
        socket, or with `restore_size` `GET path` to have the server write that many bytes
        into `file` (client/local.py); the answer's JSON. Retried like every request (each
        try opens the file anew)."""
        target = self._target(path)
        call = functools.partial(
            local.hand_over_file,
            socket_path,
            target,
            self._headers,
            file,
            self._conns.timeout,
            restore_size=restore_size,
        )
        method = "PUT" if restore_size is None else "GET"

        async def attempt() -> Any:
            status, answer_headers, payload = await self._on_thread(call)
            self._count(0, len(payload))
            if status >= 400:
                raise _refusal(status, answer_headers, payload)
            return _parse(payload)

        return await self.retrying(f"{method} {path} (descriptor)", attempt)

    async def _on_thread(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise TransportError("the client is closed")
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    def _target(self, path: str, params: Mapping[str, str] | None = None) -> str:
        """The request target: the URL's path prefix, `path` with anything unsafe escaped
        (what the caller escaped stays as it is), the query."""
        target = self._conns.prefix + quote(path, safe=_PATH_SAFE)
        return f"{target}?{urlencode(params)}" if params else target

    def _count(self, sent: int, received: int) -> None:
        self.transfer.requests += 1
        self.transfer.bytes_sent += sent
        self.transfer.bytes_received += received


class Stream:
    """An answer's body, read piece by piece on the transport's threads."""

    def __init__(
        self, t: Transport, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse
    ) -> None:
        self._t = t
        self._conn: http.client.HTTPConnection | None = conn
        self._resp = resp

    async def read(self, n: int) -> bytes:
        """Up to `n` bytes; fewer only at the end. Raises `Broken` if the network fails."""
        data = await self._t._on_thread(wire.read, self._resp, n)
        self._t.transfer.bytes_received += len(data)
        return data

    def release(self) -> None:
        """Done with it: the connection goes back if the body was read to its end."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            wire.finish(self._t._conns, conn, self._resp)


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


def _parse(payload: bytes) -> Any:
    try:
        return json.loads(payload)
    except ValueError:
        return None


__all__ = ["ClientError", "RetryPolicy", "Transport"]
