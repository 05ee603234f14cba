"""Large downloads outside the event loop.

aiohttp hands a response body to the event loop 256 KiB at a time, as fresh bytes objects
that its stream reader joins again: restoring 1 GB cost the client's loop ~3 s of CPU, and
the loop, not the disk, set the pace of a restore. A file download instead runs on a thread
with a plain HTTP/1.1 connection (the standard library's `http.client`): the socket is read
straight into a few reused buffers (`recv_into`, which drops the interpreter lock), and a
second thread consumes each filled buffer (hashes and writes it) while the next one fills.

Only this module's `Broken` means "the network failed": the caller retries it from where
the body stopped. Anything the consumer raises (a full disk) passes through unchanged.
"""

from __future__ import annotations

import http.client
import ssl
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from urllib.parse import urlsplit

BUFFER = 4 << 20  # bytes per socket read: large enough that per-read overhead vanishes
BUFFERS = 3  # one filling, one being consumed, one spare so neither waits on the other
IDLE_CONNECTIONS = 2


class Broken(Exception):
    """The connection failed or the body ended early: worth asking again by Range."""


class Stopped(Exception):
    """The download was abandoned by its caller (cancelled)."""


Refusal = Callable[[int, Mapping[str, str], bytes], Exception]


class Connections:
    """Keep-alive HTTP/1.1 connections to one server, reused across downloads (a restore of
    many files pays one handshake, not one per file). Thread-safe."""

    def __init__(self, url: str, tls: ssl.SSLContext | None, timeout: float) -> None:
        parts = urlsplit(url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "localhost"
        self._port = parts.port or (443 if self._https else 80)
        self.prefix = parts.path.rstrip("/")
        self._tls = tls  # None for https: the system's CAs, loaded once at the first connection
        self._timeout = timeout
        self._idle: list[http.client.HTTPConnection] = []
        self._closed = False
        self._lock = threading.Lock()

    def take(self, fresh: bool = False) -> http.client.HTTPConnection:
        """An idle kept-alive connection, else (or if `fresh`) a new one."""
        with self._lock:
            if self._idle and not fresh:
                return self._idle.pop()
        if self._https:
            if self._tls is None:
                self._tls = ssl.create_default_context()
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=self._timeout, context=self._tls
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)

    def give(self, conn: http.client.HTTPConnection) -> None:
        """Return a connection whose last response was read to its end (a download whose
        caller gave up may finish after `close`: its connection is closed then)."""
        with self._lock:
            if not self._closed and len(self._idle) < IDLE_CONNECTIONS:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def receive(
    conns: Connections,
    path: str,
    headers: Mapping[str, str],
    start: int,
    consume: Callable[[memoryview], None],
    refusal: Refusal,
    stop: threading.Event,
) -> None:
    """GET `path` from byte `start` to its end, handing the body to `consume` in order, on
    one other thread. Raises `Broken` when the network fails (what was consumed before it
    stays consumed: the caller counts it in `consume` and resumes after it), and
    `refusal(status, headers, body)` for an error answer."""
    conn, resp = _open(conns, conns.prefix + path, headers, start)
    reusable = False
    try:
        if resp.status >= 400:
            body = _read_all(resp)
            reusable = not resp.will_close
            raise refusal(resp.status, dict(resp.getheaders()), body)
        if start and resp.status != 206:
            raise Broken(f"asked from byte {start}, got status {resp.status} instead of 206")
        _pump(resp, consume, stop)
        reusable = not resp.will_close
    finally:
        if reusable:
            conns.give(conn)
        else:
            conn.close()


def _open(
    conns: Connections, target: str, headers: Mapping[str, str], start: int
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """A connection and the answer's status and headers. A kept-alive connection the
    server has closed meanwhile (an idle timeout, a restart) fails before any answer: it is
    replaced by a new one at once, which costs no attempt of the retry policy."""
    conn = conns.take()
    kept_alive = conn.sock is not None
    try:
        return conn, _ask(conn, target, headers, start)
    except Broken:
        conn.close()
        if not kept_alive:
            raise
    conn = conns.take(fresh=True)
    try:
        return conn, _ask(conn, target, headers, start)
    except BaseException:
        conn.close()
        raise


def _ask(
    conn: http.client.HTTPConnection, target: str, headers: Mapping[str, str], start: int
) -> http.client.HTTPResponse:
    hdrs = dict(headers)
    if start:
        hdrs["Range"] = f"bytes={start}-"
    try:
        conn.request("GET", target, headers=hdrs)
        return conn.getresponse()
    except (OSError, http.client.HTTPException) as e:
        raise Broken(f"GET {target}: {e!r}") from e


def _read_all(resp: http.client.HTTPResponse) -> bytes:
    try:
        return resp.read()
    except (OSError, http.client.HTTPException) as e:
        raise Broken(f"reading an error answer: {e!r}") from e


def _pump(
    resp: http.client.HTTPResponse, consume: Callable[[memoryview], None], stop: threading.Event
) -> None:
    """Socket → buffers → `consume` on a second thread; a buffer is refilled only once the
    consumer is done with it. Every buffer handed over is consumed before this returns or
    raises, and a consumer's error wins over a network one."""
    buffers = [memoryview(bytearray(BUFFER)) for _ in range(BUFFERS)]
    pending: list[Future[None] | None] = [None] * BUFFERS
    with ThreadPoolExecutor(1, thread_name_prefix="ckpt-consume") as consumer:
        try:
            i = 0
            while True:
                if stop.is_set():
                    raise Stopped("download cancelled")
                previous, pending[i] = pending[i], None
                if previous is not None:
                    previous.result()
                n = _fill(resp, buffers[i])
                if n == 0:
                    return
                pending[i] = consumer.submit(consume, buffers[i][:n])
                i = (i + 1) % BUFFERS
        finally:
            for fut in pending:
                if fut is not None:
                    fut.result()


def _fill(resp: http.client.HTTPResponse, buffer: memoryview) -> int:
    """Bytes read into `buffer` (it fills up unless the body ends); 0 at the body's end.
    http.client reports a body cut short as its end, so the remaining length is checked."""
    try:
        n = resp.readinto(buffer)
    except (OSError, http.client.HTTPException) as e:
        raise Broken(f"reading the body: {e!r}") from e
    if n == 0 and resp.length:
        raise Broken(f"the body ended {resp.length} bytes early")
    return n
