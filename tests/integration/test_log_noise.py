"""A request aiohttp cannot parse (issue 41, low): a bad byte in a header was answered 400
and logged with an ~875-byte traceback, per request and with no token; now at most one
short line a second per process, and still 400. Against a real `ckpt serve` process: its
logging is set up by `node/serve.py`, which the in-process app does not run."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..serverproc import ServerProcess, free_port

REQUESTS = 50
WAIT = 10.0  # seconds a socket may wait for the server: a bound, not a pace


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path / "data", free_port(), tmp_path / "server.log")
    try:
        proc.start()
        yield proc
    finally:
        proc.stop()


def _bad_header(server: ServerProcess) -> bytes:
    with socket.create_connection((server.host, server.port), timeout=WAIT) as sock:
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Bad: a\x01b\r\n\r\n")
        return sock.recv(64)


def _records(server: ServerProcess) -> list[dict[str, object]]:
    lines = server.log_path.read_text().splitlines()
    return [json.loads(ln) for ln in lines if ln.startswith("{")]


def test_unparseable_requests_log_a_short_line_a_second(server: ServerProcess) -> None:
    before = len(server.log_path.read_text())
    started = time.monotonic()
    answers = [_bad_header(server) for _ in range(REQUESTS)]
    took = time.monotonic() - started
    assert all(a.startswith(b"HTTP/1.") and b" 400 " in a for a in answers), answers[:3]
    assert server.terminate() == 0
    text = server.log_path.read_text()[before:]
    assert "Traceback" not in text
    about = [r for r in _records(server) if r["logger"] == "aiohttp.server"]
    assert about, "the first one is logged"
    assert len(about) <= took + 1, about  # one a second at most (before: 50)
    assert all("unparseable request from 127.0.0.1 answered 400" in str(r["msg"]) for r in about)
    assert all(len(json.dumps(r)) < 400 for r in about)  # before: ~1,100 bytes each
