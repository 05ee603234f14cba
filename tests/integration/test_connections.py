"""Connections that hold the server's descriptors (issue 30, finding 8): a request head that
never finishes is closed after `server.header_timeout`, and TCP connections past the
descriptor bound (`server.spare_descriptors` under RLIMIT_NOFILE) are refused at accept,
logged a line a second rather than one per accept.

Against a real `ckpt serve` process: the listening sockets and the keep-alive timer are set
up by `node/serve.py`, which the in-process app does not run; the descriptor limit is the
child's own (inherited from a limit lowered around its start)."""

from __future__ import annotations

import contextlib
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..serverproc import ServerProcess, free_port

WAIT = 30.0  # seconds a socket read may wait for the server: a bound, not a pace


def _server(tmp_path: Path, config: str) -> ServerProcess:
    path = tmp_path / "vault.toml"
    path.write_text(config)
    return ServerProcess(tmp_path / "data", free_port(), tmp_path / "server.log", path)


@pytest.fixture
def quick_heads(tmp_path: Path) -> Iterator[ServerProcess]:
    server = _server(tmp_path, '[server]\nheader_timeout = "1s"\n')
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.mark.slow
def test_a_request_head_that_never_finishes_is_closed(quick_heads: ServerProcess) -> None:
    with socket.create_connection((quick_heads.host, quick_heads.port), timeout=WAIT) as sock:
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")  # no blank line: unfinished
        try:
            got = sock.recv(4096)
        except ConnectionResetError:
            got = b""
    assert got == b"", got[:200]


@contextlib.contextmanager
def _descriptor_limit(soft: int) -> Iterator[None]:
    """This process's soft RLIMIT_NOFILE lowered, for a child started meanwhile to inherit."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


def _health_on(sock: socket.socket) -> int:
    """The status of a health request sent down `sock`, 0 if the server closed it."""
    try:
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        head = sock.recv(64)
    except (ConnectionResetError, BrokenPipeError):
        return 0
    return int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0


def test_connections_past_the_descriptor_bound_are_refused(tmp_path: Path) -> None:
    """Under a 400-descriptor limit with 300 kept spare, the 200 connections below cannot
    all be taken: past the bound, each new one closes the oldest that has not sent a
    request head yet (api/heads.py), or is closed at accept when there is none (before:
    all were taken, and a few hundred more made accept fail with EMFILE), while those
    kept still answer."""
    server = _server(tmp_path, "[server]\nspare_descriptors = 300\n")
    socks: list[socket.socket] = []
    try:
        with _descriptor_limit(400):
            server.start()
        for _ in range(200):
            socks.append(socket.create_connection((server.host, server.port), timeout=WAIT))
        statuses = [_health_on(s) for s in socks]
        for s in socks:
            s.close()
        socks.clear()
        served, refused = statuses.count(200), statuses.count(0)
        assert served + refused == 200, statuses
        assert served >= 20, statuses
        assert refused >= 50, statuses
        # Once they are gone, a new connection is served again (as soon as the server has
        # seen them close: on a loaded machine the first tries may still be refused).
        deadline = time.monotonic() + WAIT
        while True:
            with socket.create_connection((server.host, server.port), timeout=WAIT) as s:
                if _health_on(s) == 200:
                    break
            assert time.monotonic() < deadline, "still refused after the connections closed"
        log = server.log_path.read_text(errors="replace")
        said = ("connections refused", "without a request head closed")
        lines = [line for line in log.splitlines() if any(s in line for s in said)]
        assert 1 <= len(lines) < refused, lines
        assert "out of system resource" not in log
    finally:
        for s in socks:
            s.close()
        server.stop()
