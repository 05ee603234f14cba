"""The client's HTTP/1.1: keep-alive connections to the server, used from threads.

Every request of the client runs on a worker thread (or a blocked caller's), not on the
event loop, over these connections: streamed reads through the standard library's
`http.client`, whole requests and answers straight on the socket (client/http1.py). A
body of any size then never passes through the loop in 256 KiB pieces (restoring 1 GB
through aiohttp cost the client's loop ~3 s of CPU), a blocking socket read or write drops
the interpreter lock, and importing the client costs no HTTP stack (aiohttp took
0.15-0.25 s to import: a third of `ckpt pull` of a 327 MB file).

Only `Broken` means "the network failed": the transport's one retry loop asks again. A
kept-alive connection the server closed meanwhile (its idle timeout, a restart) is seen
before it is used (its socket is readable: the server's FIN) and replaced, so it costs no
attempt of the retry policy.
"""

from __future__ import annotations

import contextlib
import http.client
import select
import socket
import ssl
import threading
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

CONNECT_TIMEOUT = 10.0  # seconds to open a connection; reads wait for the caller's timeout
_TCP_CORK: int | None = getattr(socket, "TCP_CORK", None)

Body = Iterable[bytes | bytearray | memoryview]


class Broken(Exception):
    """The connection failed or a body ended early: worth asking again."""


class Connections:
    """Keep-alive connections to one server. Thread-safe. `close` also shuts the sockets of
    connections in use, so a thread blocked on an abandoned request returns at once."""

    def __init__(self, url: str, tls: ssl.SSLContext | None, timeout: float, keep: int) -> None:
        parts = urlsplit(url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "localhost"
        self._port = parts.port or (443 if self._https else 80)
        self.prefix = parts.path.rstrip("/")
        default = 443 if self._https else 80
        name = f"[{self._host}]" if ":" in self._host else self._host
        self.host = name if self._port == default else f"{name}:{self._port}"  # Host header
        self._tls = tls  # None for https: the system's CAs, loaded at the first connection
        self.timeout = timeout  # longest wait for the server's next bytes, once connected
        self._keep = keep  # idle connections kept for reuse
        self._idle: list[http.client.HTTPConnection] = []
        self._busy: set[http.client.HTTPConnection] = set()
        self._closed = False
        self._lock = threading.Lock()

    def take(self) -> http.client.HTTPConnection:
        """An idle kept-alive connection still open, else a new, not yet connected one."""
        while True:
            with self._lock:
                if self._closed:
                    raise Broken("the client is closed")
                conn = self._idle.pop() if self._idle else self._new()
                self._busy.add(conn)
            if conn.sock is None or not _dropped(conn.sock):
                return conn
            self.drop(conn)

    def give(self, conn: http.client.HTTPConnection) -> None:
        """Return a connection whose last answer was read to its end."""
        with self._lock:
            self._busy.discard(conn)
            if not self._closed and len(self._idle) < self._keep:
                self._idle.append(conn)
                return
        conn.close()

    def drop(self, conn: http.client.HTTPConnection) -> None:
        """Close a connection that cannot be reused (an answer not read to its end)."""
        with self._lock:
            self._busy.discard(conn)
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            busy = list(self._busy)
        for conn in idle:
            conn.close()
        for conn in busy:  # wakes a thread blocked in recv or send; it then drops the conn
            sock = conn.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _new(self) -> http.client.HTTPConnection:
        if self._https:
            if self._tls is None:
                self._tls = ssl.create_default_context()
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=CONNECT_TIMEOUT, context=self._tls
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=CONNECT_TIMEOUT)


def ask(
    conns: Connections,
    method: str,
    target: str,
    headers: Mapping[str, str],
    body: Body | None = None,
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """Send a request; return its connection and the answer's status and headers (the
    body is the caller's to read, then to `finish`)."""
    conn = conns.take()
    try:
        return conn, _send(conn, method, target, headers, body, conns.timeout)
    except BaseException:
        conns.drop(conn)
        raise


def read(resp: http.client.HTTPResponse, n: int) -> bytes:
    """Up to `n` bytes of the body (all of it if negative); fewer only at its end. A body
    that ends before its Content-Length is `Broken`, not a short answer."""
    try:
        data = resp.read() if n < 0 else resp.read(n)
    except (OSError, http.client.HTTPException) as e:
        raise Broken(f"reading the answer: {e!r}") from e
    if (n < 0 or len(data) < n) and resp.length:
        raise Broken(f"the answer ended {resp.length} bytes early")
    return data


def finish(
    conns: Connections, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse
) -> None:
    """Hand the connection back, or close it if its answer was not read to the end."""
    if resp.isclosed() and not resp.will_close:
        conns.give(conn)
    else:
        conns.drop(conn)


def _dropped(sock: socket.socket) -> bool:
    """Whether an idle kept-alive connection was closed by the server: between answers
    it has nothing to say, so anything to read is its FIN (or its reset)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _cork(sock: socket.socket, on: bool) -> None:
    if _TCP_CORK is not None:
        sock.setsockopt(socket.IPPROTO_TCP, _TCP_CORK, int(on))


def opened(conn: http.client.HTTPConnection, timeout: float) -> socket.socket:
    """The connection's socket, connecting first if need be (within CONNECT_TIMEOUT; then
    each read waits up to `timeout`)."""
    if conn.sock is None:
        conn.connect()
        _settimeout(conn, timeout)
    sock: socket.socket = conn.sock
    return sock


def _settimeout(conn: http.client.HTTPConnection, timeout: float) -> None:
    conn.sock.settimeout(timeout)


def _send(
    conn: http.client.HTTPConnection,
    method: str,
    target: str,
    headers: Mapping[str, str],
    body: Body | None,
    timeout: float,
) -> http.client.HTTPResponse:
    """The request, connecting first if need be (within CONNECT_TIMEOUT; then each read
    waits up to `timeout`). Corked where the system can (Linux): http.client sends the
    headers and each part of the body separately, and with Nagle off each went as a segment
    of its own; the server's loop then woke once per piece (a 100 kB one-request save cost
    it ~0.6 ms of CPU more, and took ~1 ms longer)."""
    try:
        opened(conn, timeout)
        _cork(conn.sock, True)
        conn.request(method, target, body=body, headers=dict(headers))
        _cork(conn.sock, False)
        return conn.getresponse()
    except (OSError, http.client.HTTPException) as e:
        raise Broken(f"{method} {target}: {e!r}") from e
