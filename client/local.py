"""Handing files to a server on this machine instead of sending their bytes.

A server also listens on a Unix-domain socket in its data dir (`GET /v1/health` names it,
with an id of the running server). A client that reached that server on loopback and can
reach the socket too gives it each file of a save as an open descriptor (SCM_RIGHTS), and
the server reads, cuts and hashes the file itself: the bytes are read once, on one side,
instead of read, cut and hashed here, sent, received and verified there, which is ~1 s of
CPU per GB less on the two sides together. The descriptor is this process's open file,
so the server reads only what this process could read; the token is checked as for any
request. A load hands over the other way: each file it restores, open for writing, which
the server fills with the stored bytes, verified and synced (vault/deliver.py), instead of
sending them to be written and hashed again here.

Blocking functions over `http.client`, run on the transport's threads like every request.
"""

from __future__ import annotations

import http.client
import io
import json
import os
import socket
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from checkpoint_vault.protocol import CONTINUE, DESCRIPTOR_TYPE

from .connections import Broken
from .errors import IntegrityError

# A descriptor's answer comes once the server has read the file: the timeout grows with it.
SLOWEST_READ = 20e6  # bytes per second assumed of the server reading a handed-over file


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def socket_of(health: Any, timeout: float) -> str | None:
    """The local socket a server's `GET /v1/health` answer (asked on loopback) names, if
    this process can use it and it leads to that same server (the path came from a server
    reached on loopback, which may be a tunnel to another machine); else None."""
    if not isinstance(health, dict):
        return None
    path, instance = health.get("local_socket"), health.get("instance")
    if not isinstance(path, str) or not isinstance(instance, str) or not is_socket(path):
        return None
    answer = get_json(UnixConnection(path, timeout), "/v1/health")
    return path if isinstance(answer, dict) and answer.get("instance") == instance else None


def get_json(
    conn: http.client.HTTPConnection, target: str, headers: Mapping[str, str] | None = None
) -> Any:
    """The JSON of a 200 answer to `GET target` on a fresh connection (closed after), or
    None for any other answer, a broken connection or a body that is not JSON."""
    try:
        conn.request("GET", target, headers=dict(headers or {}))
        resp = conn.getresponse()
        body = resp.read()
        return json.loads(body) if resp.status == 200 else None
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        conn.close()


def check_restored(what: str, answer: Any, file: Path, size: int, digest: str) -> None:
    """A restore written by the server ended as asked: its answer names the file's size and
    hash, and the file has that size (it verified every chunk as it wrote)."""
    written = os.path.getsize(file)
    if answer != {"size": size, "hash": digest} or written != size:
        raise IntegrityError(f"{what}: the server wrote {written} bytes, not the file asked for")


class Unsupported(Exception):
    """The server answered a descriptor with something else than JSON: it predates
    restoring into descriptors and sent the file's bytes instead (left unread)."""


def hand_over_file(
    path: str,
    target: str,
    headers: Mapping[str, str],
    file: Path,
    timeout: float,
    *,
    restore_size: int | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """`hand_over` of the file at `file`, opened here and closed once answered: the
    descriptor lives exactly as long as the call using it (a caller that gave up meanwhile
    cannot close it under the thread, whose number a new file could then take). To save
    it: `PUT`, opened for reading. With `restore_size`, to restore into it: `GET`, opened
    for writing and emptied; it must exist already, so a caller that gave up and removed
    it meanwhile gets an error here rather than a new file left behind."""
    if restore_size is None:  # as the HTTP path, a missing file raises
        fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
    else:
        fd = os.open(file, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    try:
        if restore_size is None:
            return hand_over(path, target, headers, fd, os.fstat(fd).st_size, timeout)
        return hand_over(path, target, headers, fd, restore_size, timeout, method="GET")
    finally:
        os.close(fd)


def hand_over(
    path: str,
    target: str,
    headers: Mapping[str, str],
    fd: int,
    size: int,
    timeout: float,
    method: str = "PUT",
) -> tuple[int, dict[str, str], bytes]:
    """`method target` over the socket at `path`, its body the descriptor `fd` (a file of
    `size` bytes, to read or to fill): status, headers and body of the answer. The
    descriptor goes only after the server's `100 Continue`: it takes the socket from its
    HTTP stack first, whose reads would drop it."""
    conn = UnixConnection(path, max(timeout, size / SLOWEST_READ))
    try:
        conn.putrequest(method, target, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.putheader("Content-Type", DESCRIPTOR_TYPE)
        conn.putheader("Content-Length", "1")
        conn.putheader("Expect", "100-continue")
        conn.endheaders()
        resp = _answer_after_descriptor(conn, fd, method)
        if resp.getheader("Content-Type", "").split(";")[0].strip() != "application/json":
            raise Unsupported(f"{method} {target} with a descriptor answered {resp.status}")
        return resp.status, dict(resp.getheaders()), resp.read()
    except (OSError, http.client.HTTPException) as e:
        raise Broken(f"{method} {target} on {path}: {e!r}") from e
    finally:
        conn.close()


def _answer_after_descriptor(
    conn: UnixConnection, fd: int, method: str
) -> http.client.HTTPResponse:
    """Wait for the server's first answer: on `100 Continue` send the descriptor and read
    the final answer; anything else is the final answer already (a refusal: the server
    never took the socket), read with the bytes taken to tell the two apart put back."""
    sock = conn.sock
    first = b""
    while len(first) < len(CONTINUE):
        more = sock.recv(len(CONTINUE) - len(first))
        if not more:
            break
        first += more
    if first == CONTINUE:
        socket.send_fds(sock, [b"\0"], [fd])
        return conn.getresponse()
    resp = http.client.HTTPResponse(_Replayed(first, sock), method=method)  # type: ignore[arg-type]
    resp.begin()
    return resp


class _Replayed:
    """The socket as http.client reads it, with bytes already taken off it put first."""

    def __init__(self, first: bytes, sock: socket.socket) -> None:
        self._first = first
        self._sock = sock

    def makefile(self, mode: str, *args: object, **kwargs: object) -> io.BufferedReader:
        return io.BufferedReader(_Chain(self._first, self._sock))


class _Chain(io.RawIOBase):
    def __init__(self, first: bytes, sock: socket.socket) -> None:
        self._first = memoryview(first)
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._first:
            n = min(len(buffer), len(self._first))
            buffer[:n] = self._first[:n]
            self._first = self._first[n:]
            return n
        return self._sock.recv_into(buffer)


def is_socket(path: str) -> bool:
    """Whether `path` is a socket file (a server's local socket, not yet known whose)."""
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False
