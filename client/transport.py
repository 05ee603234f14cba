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

from . import bulkget, fastjson, http1, local
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
        self._counting = threading.Lock()

    async def close(self) -> None:
        """Close every connection (a request still running on a thread fails at once); the
        threads stop once their work has."""
        self._closed = True
        self._conns.close()
        self._threads.shutdown(wait=False)

    async def retrying(self, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """`attempt()` until it succeeds, fails for good, or the policy says stop. The one
        retry loop of the client's coroutines (`retrying_here` is the same loop for a
        blocked caller): every request goes through one of them."""
        started = time.monotonic()
        n = 0
        while True:
            try:
                return await attempt()
            except (Broken, ClientError) as e:
                wait = self._wait_after(what, e, n, started)
            n += 1
            await asyncio.sleep(wait)

    def retrying_here(self, what: str, attempt: Callable[[], T]) -> T:
        """`retrying` on the caller's thread, for a call that blocks it anyway (a small
        save of `VaultClient`): the same policy and decisions, `time.sleep` between tries."""
        started = time.monotonic()
        n = 0
        while True:
            try:
                return attempt()
            except (Broken, ClientError) as e:
                wait = self._wait_after(what, e, n, started)
            n += 1
            time.sleep(wait)

    def _wait_after(self, what: str, error: Broken | ClientError, n: int, started: float) -> float:
        """The wait before asking again after try `n` (from 0) failed with `error`, counted
        as a retry; or `error` raised when it cannot succeed or the policy says stop (a
        network failure as a TransportError). Called inside the retry loops' `except`."""
        if retryable(error):
            after = error.retry_after if isinstance(error, ClientError) else None
            wait = self.retry.wait(n, time.monotonic() - started, after)
            if wait is not None:
                self._count(retries=1)
                return wait
        if isinstance(error, ClientError):
            raise error
        raise TransportError(f"{what}: {error!r} (after {n + 1} attempts)") from error

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
        attempt = self._exchange(method, path, json_body, data, headers, params)
        return await self.retrying(f"{method} {path}", lambda: self._on_thread(attempt))

    async def json(self, method: str, path: str, **kwargs: Any) -> Any:
        _, payload = await self.request(method, path, **kwargs)
        return _parse(payload) if payload else None

    def json_here(
        self,
        method: str,
        path: str,
        *,
        data: bytes | Sequence[bytes] | None = None,
        headers: dict[str, str] | None = None,
        params: dict[str, str] | None = None,
        parse: bool = True,
    ) -> Any:
        """`json` on the caller's thread, which it blocks: no hop to the loop and none to a
        transport thread, for a small request whose caller waits for it anyway. The same
        connections, headers, retries and errors as `json`. `parse=False`: a success's
        answer is not read (None), for a caller that needs nothing of it."""
        attempt = self._exchange(method, path, None, data, headers, params)
        _, payload = self.retrying_here(f"{method} {path}", lambda: self._now(attempt))
        return _parse(payload) if payload and parse else None

    def prepare(self, method: str, path: str, headers: Mapping[str, str]) -> Prepared:
        """A request sent often with other bodies (one namespace's one-request saves): its
        target, headers and head made once; `send_here` adds only the body's length."""
        head = http1.head(
            method, self._target(path), self._conns.host, {**self._headers, **headers}
        )
        return Prepared(method, f"{method} {path}", head[:-2])  # without the head's end

    def send_here(self, request: Prepared, parts: Sequence[bytes], *, parse: bool = True) -> Any:
        """`json_here` of a prepared request with `parts` as its body: the same
        connections, retries, counts and errors, without making its head again (through
        LangGraph's VaultSaver that cost ~15 us of a put's ~0.3 ms)."""
        size = sum(map(len, parts))
        head = b"%sContent-Length: %d\r\n\r\n" % (request.head, size)

        def attempt() -> tuple[int, bytes]:
            return self._answered(
                http1.exchange_head(self._conns, request.method, head, parts), size
            )

        _, payload = self.retrying_here(request.what, lambda: self._now(attempt))
        return _parse(payload) if payload and parse else None

    def _answered(self, answer: tuple[int, dict[str, str], bytes], sent: int) -> tuple[int, bytes]:
        """A whole exchange's (status, body), counted; its ClientError for a refusal."""
        status, answer_headers, payload = answer
        self._count(requests=1, sent=sent, received=len(payload))
        if status >= 400:
            raise _refusal(status, answer_headers, payload)
        return status, payload

    def _exchange(
        self,
        method: str,
        path: str,
        json_body: Any,
        data: bytes | Sequence[bytes | memoryview] | None,
        headers: dict[str, str] | None,
        params: dict[str, str] | None,
    ) -> Callable[[], tuple[int, bytes]]:
        """One try of a request, as a blocking call: (status, body) of a success, else its
        ClientError raised (`Broken` when the network failed)."""
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

        def attempt() -> tuple[int, bytes]:
            return self._answered(http1.exchange(self._conns, method, target, hdrs, parts), size)

        return attempt

    async def open_stream(self, path: str, headers: dict[str, str] | None = None) -> Stream:
        """A GET whose body the caller reads and then releases; retried until it answers."""
        hdrs = {**self._headers, **(headers or {})}
        ask = functools.partial(wire.ask, self._conns, "GET", self._target(path), hdrs)

        async def attempt() -> Stream:
            self._count(requests=1)
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
            self._count(received=len(piece))

        async def attempt() -> None:
            self._count(requests=1)
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
            self._count(requests=1, received=len(payload))
            if status >= 400:
                raise _refusal(status, answer_headers, payload)
            return _parse(payload)

        return await self.retrying(f"{method} {path} (descriptor)", attempt)

    async def _on_thread(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise TransportError("the client is closed")
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    def _now(self, fn: Callable[[], T]) -> T:
        """`fn()` on this thread, as `_on_thread` would run it on one of the transport's."""
        if self._closed:
            raise TransportError("the client is closed")
        return fn()

    def _target(self, path: str, params: Mapping[str, str] | None = None) -> str:
        """The request target: the URL's path prefix, `path` with anything unsafe escaped
        (what the caller escaped stays as it is), the query."""
        target = self._conns.prefix + quote(path, safe=_PATH_SAFE)
        return f"{target}?{urlencode(params)}" if params else target

    def _count(
        self, *, requests: int = 0, sent: int = 0, received: int = 0, retries: int = 0
    ) -> None:
        """Called on whichever thread made the request: callers' threads, the loop and the
        transport's threads count at once, so under a lock (`+=` is not atomic)."""
        with self._counting:
            self.transfer.requests += requests
            self.transfer.bytes_sent += sent
            self.transfer.bytes_received += received
            self.transfer.retries += retries


@dataclass(frozen=True)
class Prepared:
    """`Transport.prepare`'s request: its method, what errors call it, and its head up to
    the body's length."""

    method: str
    what: str
    head: bytes


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
        self._t._count(received=len(data))
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
    """Retry-After in seconds (it may be a number or an HTTP date); None if absent. Header
    names are matched without case: a proxy in front (HAProxy 2, any HTTP/2 hop) sends
    them lower-cased, and the client ignored the server's Retry-After behind one."""
    value = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
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
        return fastjson.loads(payload)
    except ValueError:
        return None


__all__ = ["ClientError", "RetryPolicy", "Transport"]
