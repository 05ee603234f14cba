"""One whole HTTP/1.1 request and answer on a kept-alive socket, without `http.client`.

Most of the client's requests are small and whole: a one-request save, a listing, a
metadata call. Through `http.client` each cost ~0.25 ms of client CPU, most of it in
validating header names one `putheader` at a time and parsing the answer's headers with
the `email` package; a LangGraph put is one such request and PostgresSaver's whole put
costs ~0.35 ms. Here a request is one preformatted head written with its body parts in
one gathered write (`sendmsg`: no joined copy of a 100 kB message history), and an
answer that arrives in one read (nearly all) is split by hand from that read.

It runs on the socket of an idle `http.client.HTTPConnection` from the pool
(client/connections.py) and leaves it idle: the answer is read exactly to its end (a
Content-Length body, a chunked one and its trailers, or, when the server says it will
close, to the end of the stream, after which the connection is not reused), so streaming
requests can take the same connection next with `http.client`.

Only `Broken` means the network failed (or the server answered something this reader
cannot frame): the transport's retry loop asks again on another connection.
"""

from __future__ import annotations

import io
import socket
import ssl
from collections.abc import Mapping, Sequence
from typing import Any

from .connections import Body, Broken, Connections, opened

JOIN_LIMIT = 256 << 10  # bodies up to this size are copied behind the head: one send
MAX_HEAD = 64 << 10  # an answer's status line and headers together
LARGE_BODY = 1 << 20  # a body with this much still to read is read into its result in place
_RECV = 64 << 10
_IOV_MAX = 1024  # buffers one sendmsg takes (Linux's UIO_MAXIOV)
_TCP_CORK: int | None = getattr(socket, "TCP_CORK", None)
_NO_BODY = frozenset({204, 304})

_EXPECTING_BODY = frozenset({"PATCH", "POST", "PUT"})

Answer = tuple[int, dict[str, str], bytes, bool]  # status, headers, body, reusable


def exchange(
    conns: Connections,
    method: str,
    target: str,
    headers: Mapping[str, str],
    body: Body | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One whole request and answer on a pooled connection: status, headers and body.
    The connection goes back to the pool only when its answer was read to the end and
    the server keeps it open."""
    parts = list(body) if body is not None else []
    if body is None and method in _EXPECTING_BODY and "Content-Length" not in headers:
        headers = {**headers, "Content-Length": "0"}  # as http.client sends it
    return exchange_head(conns, method, head(method, target, conns.host, headers), parts)


def exchange_head(
    conns: Connections,
    method: str,
    request_head: bytes,
    parts: Sequence[bytes | bytearray | memoryview],
) -> tuple[int, dict[str, str], bytes]:
    """`exchange` of a head made already (`head`, or a prefix of it kept by a caller that
    sends the same request often with other bodies: `Transport.prepare`)."""
    conn = conns.take()
    try:
        sock = opened(conn, conns.timeout)
        send(sock, request_head, parts)
        status, answer_headers, payload, reusable = receive(sock, method)
    except OSError as e:
        conns.drop(conn)
        line = request_head[: request_head.find(b" HTTP/1.1")].decode("latin-1")
        raise Broken(f"{line}: {e!r}") from e
    except BaseException:
        conns.drop(conn)
        raise
    if reusable:
        conns.give(conn)
    else:
        conns.drop(conn)
    return status, answer_headers, payload


def head(method: str, target: str, host: str, headers: Mapping[str, str]) -> bytes:
    """The request line and headers, ready to send. A header name or value holding a line
    break is refused (ValueError), as `http.client` refuses it: it would split the head."""
    lines = [f"{method} {target} HTTP/1.1\r\nHost: {host}\r\nAccept-Encoding: identity\r\n"]
    for name, value in headers.items():
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value or ":" in name:
            raise ValueError(f"invalid header {name!r}")
        lines.append(f"{name}: {value}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")


def send(
    sock: socket.socket, request_head: bytes, body: Sequence[bytes | bytearray | memoryview]
) -> None:
    """The head and body parts as one write: gathered by the kernel (`sendmsg`) on a plain
    socket, so no part is copied into a joined buffer, and one segment (one wake-up of the
    server's loop) when small. TLS has no gathered write: a small request is joined, a
    large one corked so the head does not leave alone."""
    if not isinstance(sock, ssl.SSLSocket) and hasattr(sock, "sendmsg"):
        _gathered(sock, [request_head, *body])
        return
    if sum(len(p) for p in body) <= JOIN_LIMIT:
        sock.sendall(b"".join([request_head, *body]) if body else request_head)
        return
    _cork(sock, True)
    sock.sendall(request_head)
    for part in body:
        sock.sendall(part)
    _cork(sock, False)


def _gathered(sock: socket.socket, parts: Sequence[bytes | bytearray | memoryview]) -> None:
    """`sendall` of the parts one after the other, in as few `sendmsg` calls as the kernel
    takes them (at most IOV_MAX buffers each)."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    at = 0
    while at < len(views):
        sent = sock.sendmsg(views[at : at + _IOV_MAX])
        while sent:
            n = len(views[at])
            if sent < n:
                views[at] = views[at][sent:]
                break
            sent -= n
            at += 1


def receive(sock: socket.socket, method: str) -> Answer:
    """The answer, read exactly to its end (an interim 1xx answer skipped). Usually it
    comes in one read, head and whole body: that is taken as it is."""
    first = sock.recv(_RECV)
    if not first:
        raise Broken("the server closed the connection before it answered")
    end = first.find(b"\r\n\r\n")
    if end >= 0:
        status, headers, named, will_close = _head(first[:end])
        length = headers.get("content-length")
        if (
            status >= 200
            and length is not None
            and method != "HEAD"
            and status not in _NO_BODY
            and "transfer-encoding" not in headers
            and len(first) - end - 4 == _length(length)
        ):
            return status, named, first[end + 4 :], not will_close
    return _receive_rest(_Reader(sock, first), method)


def _receive_rest(reader: _Reader, method: str) -> Answer:
    """An answer that did not come whole in its first read."""
    while True:
        status, headers, named, will_close = _head(reader.block())
        if not 100 <= status < 200:
            break
    if method == "HEAD" or status in _NO_BODY:
        body = b""
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        body = _chunked(reader)
    elif (length := headers.get("content-length")) is not None:
        body = reader.exact(_length(length))
    else:
        body, will_close = reader.to_end(), True
    if reader.left():
        raise Broken("the server sent more than its answer")
    return status, named, body, not will_close


class _Reader:
    """The socket's bytes, buffered; what an answer's framing needs to take from them."""

    def __init__(self, sock: socket.socket, first: bytes) -> None:
        self._sock = sock
        self._buf = bytearray(first)
        self._pos = 0

    def _more(self) -> None:
        data = self._sock.recv(_RECV)
        if not data:
            raise Broken("the server closed the connection before its answer ended")
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def line(self) -> bytes:
        while (end := self._buf.find(b"\r\n", self._pos)) < 0:
            if len(self._buf) - self._pos > MAX_HEAD:
                raise Broken("an answer's header line is too long")
            self._more()
        out = bytes(self._buf[self._pos : end])
        self._pos = end + 2
        return out

    def block(self) -> bytes:
        """Everything up to the next empty line (a head), without that line."""
        while (end := self._buf.find(b"\r\n\r\n", self._pos)) < 0:
            if len(self._buf) - self._pos > MAX_HEAD:
                raise Broken("an answer's head is too long")
            self._more()
        out = bytes(self._buf[self._pos : end])
        self._pos = end + 4
        return out

    def exact(self, n: int) -> bytes:
        have = len(self._buf) - self._pos
        if have >= n:
            out = bytes(self._buf[self._pos : self._pos + n])
            self._pos += n
            return out
        if n - have >= LARGE_BODY:
            return self._large(n)
        out_buf = bytearray(n)
        view = memoryview(out_buf)
        view[:have] = self._buf[self._pos :]
        self._buf, self._pos = bytearray(), 0
        while have < n:
            got = self._sock.recv_into(view[have:])
            if not got:
                raise Broken(f"the answer ended {n - have} bytes early")
            have += got
        return bytes(out_buf)

    def _large(self, n: int) -> bytes:
        """`n` bytes read straight into the bytes object returned (a BufferedReader fills
        its result in place), not into a buffer copied after: a 16 MiB range read paid
        ~10 ms for that copy on this machine."""
        rest = _Rest(memoryview(self._buf)[self._pos :], self._sock, n)
        out = io.BufferedReader(rest, _RECV).read(n)
        self._buf, self._pos = bytearray(), 0
        if len(out) < n:
            raise Broken(f"the answer ended {n - len(out)} bytes early")
        return out

    def to_end(self) -> bytes:
        out = bytearray(self._buf[self._pos :])
        self._buf, self._pos = bytearray(), 0
        while data := self._sock.recv(_RECV):
            out += data
        return bytes(out)

    def left(self) -> bool:
        return self._pos < len(self._buf)


class _Rest(io.RawIOBase):
    """A body of known length as a raw stream: what was read already, then the socket,
    never past the body's end (the connection stays clean for its next answer)."""

    def __init__(self, first: memoryview, sock: socket.socket, left: int) -> None:
        self._first = first
        self._sock = sock
        self._left = left

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        want = min(len(view), self._left)
        if want <= 0:
            return 0
        if len(self._first):
            got = min(want, len(self._first))
            view[:got] = self._first[:got]
            self._first = self._first[got:]
        else:
            got = self._sock.recv_into(view[:want])
        self._left -= got
        return got


def _head(block: bytes) -> tuple[int, dict[str, str], dict[str, str], bool]:
    """Status, headers by lower-cased name (for framing) and as sent (for the caller;
    repeated ones joined with ', ') and whether the server will close the connection
    after this answer."""
    lines = block.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise Broken(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    named: dict[str, str] = {}
    for raw in lines[1:]:
        name, colon, value = raw.partition(":")
        if not colon:
            raise Broken(f"a malformed header line: {raw[:80]!r}")
        name, value = name.strip(), value.strip()
        key = name.lower()
        if key in headers:
            value = f"{headers[key]}, {value}"
        headers[key] = named[name] = value
    connection = headers.get("connection", "").lower()
    will_close = "close" in connection or (version == "HTTP/1.0" and "keep-alive" not in connection)
    return int(code), headers, named, will_close


def _length(value: str) -> int:
    if not value.strip().isdigit():
        raise Broken(f"an answer's Content-Length is {value!r}")
    return int(value)


def _chunked(reader: _Reader) -> bytes:
    """A chunked body, its trailers read and dropped."""
    parts: list[bytes] = []
    while True:
        size_field = reader.line().split(b";", 1)[0].strip()
        try:
            size = int(size_field, 16)
        except ValueError as e:
            raise Broken(f"a malformed chunk size {size_field[:20]!r}") from e
        if size == 0:
            while reader.line():
                pass
            return b"".join(parts)
        parts.append(reader.exact(size))
        if reader.line():
            raise Broken("a chunk longer than its size")


def _cork(sock: socket.socket, on: bool) -> None:
    if _TCP_CORK is not None:
        sock.setsockopt(socket.IPPROTO_TCP, _TCP_CORK, int(on))
