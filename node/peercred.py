"""Who is at the other end of an inter-process socket, in the kernel's words (SO_PEERCRED).

The writing process serves three sockets in the data dir to its workers only: the engine
socket (forwarded requests, whose `X-Ckpt-Forwarded-For` it believes), the calls socket
(prepared saves) and the hand-over socket (client connections, by descriptor). The data
dir being 0700 keeps other users out, but not a process of the same user: a producer's
container with the data dir mounted for the client-facing `ckpt.sock` runs as the server's
uid. So each of these sockets is 0600 from before it listens, and each connection on it is
accepted only if the kernel says its peer is one of the writing process's current workers
(its pid, as the kernel recorded it at connect, is one the writing process started and has
not seen exit; and its uid is ours). A process in another pid namespace is named by its
pid in ours, or 0 where it has none: never a worker's. Others are closed at once, logged
a line a second at most.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import time
from collections.abc import Callable, Collection
from typing import NamedTuple, Protocol

log = logging.getLogger("ckpt.api")

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
SOCKET_MODE = 0o600
REFUSALS_LOGGED_EVERY = 1.0  # seconds


class Peer(NamedTuple):
    pid: int
    uid: int
    gid: int


class Sock(Protocol):
    """What `peer_of` needs of a socket (asyncio's transport sockets are not sockets)."""

    def getsockopt(self, level: int, option: int, buflen: int) -> bytes: ...


def peer_of(sock: socket.socket | Sock) -> Peer | None:
    """The process that connected `sock` (a Unix socket); None where the kernel says
    nothing (not a Unix socket, or not Linux)."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except (OSError, AttributeError):
        return None
    return Peer(*_UCRED.unpack(raw))


def is_worker(peer: Peer | None, workers: Collection[int]) -> bool:
    return peer is not None and peer.uid == os.geteuid() and peer.pid in workers


class WorkerPeers:
    """The check of one socket: `admits` a connection from a current worker only."""

    def __init__(self, where: str, workers: Callable[[], Collection[int]]) -> None:
        """`where`: the socket's name in the log; `workers`: the live worker pids."""
        self._where = where
        self._workers = workers
        self._refused = 0
        self._logged_at = -REFUSALS_LOGGED_EVERY

    def admits(self, sock: socket.socket) -> bool:
        peer = peer_of(sock)
        if is_worker(peer, self._workers()):
            return True
        self._refused += 1
        now = time.monotonic()
        if now - self._logged_at >= REFUSALS_LOGGED_EVERY:
            self._logged_at = now
            log.warning(
                "%s: refused a connection from %s, not a worker of this server (%d so far)",
                self._where,
                f"pid {peer.pid} uid {peer.uid}" if peer is not None else "an unknown peer",
                self._refused,
            )
        return False


class _CheckedListener(socket.socket):
    """A listening Unix socket whose accept() hands out only connections its check admits;
    the others are closed at once. asyncio stops accepting for this wakeup at a
    ConnectionAbortedError, and comes back while connections are queued."""

    check: Callable[[socket.socket], bool]
    bound: int  # descriptor numbers from here on are refused (as node/serve.py's _Listener)

    def accept(self) -> tuple[socket.socket, object]:
        conn, addr = super().accept()
        if conn.fileno() < self.bound and self.check(conn):
            return conn, addr
        conn.close()
        raise ConnectionAbortedError


def worker_listener(
    path: str,
    peers: WorkerPeers,
    kind: int = socket.SOCK_STREAM,
    backlog: int = 128,
    receive_buffer: int = 0,
    bound: int = 1 << 62,
) -> socket.socket:
    """A socket listening on `path` (a stale file there replaced), mode 0600 before it
    listens (nobody can connect to a socket that does not listen yet: no window), whose
    accept() gives only connections from the writing process's workers; `receive_buffer`
    (bytes), if not 0, is each connection's (SO_RCVBUF, inherited from the listener); a
    connection numbered `bound` or above is refused (descriptors kept spare), so workers
    forwarding a flood cannot take the writing process to its limit."""
    sock = _CheckedListener(socket.AF_UNIX, kind)
    sock.check = peers.admits
    sock.bound = bound
    try:
        if os.path.exists(path):
            os.unlink(path)  # a socket file left by a killed predecessor
        if receive_buffer:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.bind(path)
        os.chmod(path, SOCKET_MODE)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
