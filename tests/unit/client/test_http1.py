"""client/http1.py frames answers itself: every framing HTTP/1.1 allows, and what it must
refuse, against a peer on loopback that answers exactly the bytes each test gives it.

The vault's server (aiohttp) sends Content-Length answers in one piece; these answers are
the other forms a proxy in front of it, or another server, may send: chunked bodies with
trailers, an interim 100, a close-delimited body, an answer dribbled a few bytes at a time.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from checkpoint_vault.client import http1
from checkpoint_vault.client.connections import Broken, Connections

WAIT_S = 10.0


class Peer:
    """Accepts connections and answers each request with the next canned answer (sent in
    pieces of `drip` bytes when set), closing the connection after it when told to."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.answers: list[tuple[bytes, bool]] = []  # (bytes, close after)
        self.requests: list[bytes] = []
        self.connections = 0
        self.drip = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        with conn:
            buf = b""
            while self.answers:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, rest = buf.partition(b"\r\n\r\n")
                length = next(
                    (int(line.split(b":")[1]) for line in head.split(b"\r\n")
                     if line.lower().startswith(b"content-length:")),
                    0,
                )  # fmt: skip
                while len(rest) < length:
                    rest += conn.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + rest[:length])
                buf = rest[length:]
                answer, close = self.answers.pop(0)
                step = self.drip or len(answer)
                for at in range(0, len(answer), step):
                    conn.sendall(answer[at : at + step])
                if close:
                    return

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def peer() -> Iterator[Peer]:
    p = Peer()
    yield p
    p.close()


@pytest.fixture
def conns(peer: Peer) -> Iterator[Connections]:
    c = Connections(peer.url, None, WAIT_S, keep=2)
    yield c
    c.close()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def test_a_chunked_answer_with_trailers_is_read_whole_and_the_connection_kept(
    peer: Peer, conns: Connections
) -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Kind: a\r\n\r\n"
        b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    peer.answers += [(chunked, False), (OK, False)]
    status, headers, body = http1.exchange(conns, "GET", "/a", {})
    assert (status, body, headers["X-Kind"]) == (200, b"hello, world", "a")
    assert http1.exchange(conns, "GET", "/b", {})[2] == b"ok"
    assert peer.connections == 1  # the second request went on the same connection


def test_an_answer_dribbled_a_few_bytes_at_a_time_is_read_exactly(
    peer: Peer, conns: Connections
) -> None:
    body = bytes(range(256)) * 40
    answer = b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    peer.drip = 7
    peer.answers += [(answer, False), (OK, False)]
    assert http1.exchange(conns, "POST", "/a", {"Content-Length": "3"}, [b"abc"])[:3:2] == (
        201,
        body,
    )
    assert peer.requests[0].endswith(b"\r\n\r\nabc")
    peer.drip = 0
    assert http1.exchange(conns, "GET", "/b", {})[2] == b"ok"
    assert peer.connections == 1


def test_an_interim_100_is_skipped(peer: Peer, conns: Connections) -> None:
    peer.answers.append((b"HTTP/1.1 100 Continue\r\n\r\n" + OK, False))
    assert http1.exchange(conns, "GET", "/a", {})[:3:2] == (200, b"ok")


def test_a_body_ended_by_close_is_read_to_the_end_and_the_connection_not_reused(
    peer: Peer, conns: Connections
) -> None:
    peer.answers += [(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it", True), (OK, False)]
    assert http1.exchange(conns, "GET", "/a", {})[2] == b"all of it"
    assert http1.exchange(conns, "GET", "/b", {})[2] == b"ok"
    assert peer.connections == 2


def test_bytes_past_the_answer_break_the_connection(peer: Peer, conns: Connections) -> None:
    """A reused connection must be idle: stray bytes would be read as the next answer."""
    peer.answers += [(OK + b"HTTP/1.1 200 OK\r\n", False), (OK, False)]
    with pytest.raises(Broken):
        http1.exchange(conns, "GET", "/a", {})
    assert http1.exchange(conns, "GET", "/b", {})[2] == b"ok"
    assert peer.connections == 2


def test_an_answer_cut_short_is_broken(peer: Peer, conns: Connections) -> None:
    peer.answers.append((b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", True))
    with pytest.raises(Broken, match="early"):
        http1.exchange(conns, "GET", "/a", {})


def test_a_header_with_a_line_break_is_refused_before_anything_is_sent(
    peer: Peer, conns: Connections
) -> None:
    with pytest.raises(ValueError, match="invalid header"):
        http1.exchange(conns, "GET", "/a", {"Authorization": "Bearer x\r\nX-Evil: 1"})
    assert peer.connections == 0


def test_a_body_of_many_parts_leaves_in_order(peer: Peer, conns: Connections) -> None:
    """More parts than one gathered write takes (IOV_MAX), of a size past one send."""
    parts = [bytes([i % 251]) * (i % 97 + 1) for i in range(3000)]
    size = sum(len(p) for p in parts)
    peer.answers.append((OK, False))
    http1.exchange(conns, "PUT", "/a", {"Content-Length": str(size)}, parts)
    assert peer.requests[0].partition(b"\r\n\r\n")[2] == b"".join(parts)


def test_a_large_body_is_read_exactly_and_the_connection_kept(
    peer: Peer, conns: Connections
) -> None:
    """Past `LARGE_BODY` the body is read into its result in place: still exactly its
    length, the next answer still framed."""
    body = bytes(range(256)) * (3 * http1.LARGE_BODY // 256 + 7)
    peer.answers += [
        (b"HTTP/1.1 206 Partial\r\nContent-Length: %d\r\n\r\n" % len(body) + body, False),
        (OK, False),
    ]
    assert http1.exchange(conns, "GET", "/a", {})[2] == body
    assert http1.exchange(conns, "GET", "/b", {})[2] == b"ok"
    assert peer.connections == 1


def test_a_large_body_cut_short_is_broken(peer: Peer, conns: Connections) -> None:
    size = 2 * http1.LARGE_BODY
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"x" * (size - 10)
    peer.answers.append((cut, True))
    with pytest.raises(Broken, match="early"):
        http1.exchange(conns, "GET", "/a", {})
