"""SIGTERM with downloads in flight is quiet (issue 41, low): the writing process asked its
workers to stop twice (at shutdown and again before closing the vault), and a worker whose
own shutdown the second SIGTERM cut short printed tracebacks (aiohttp's `InvalidStateError`,
the vault-close thread's `InvalidStateError: CANCELLED`) and could exit 1. Five rounds of
start, stalled downloads on the workers, one SIGTERM: exit 0, no traceback."""

from __future__ import annotations

import http.client
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..serverproc import ServerProcess, free_port

ROUNDS = 5
READERS = 4  # downloads left unread per round (the workers take them)
SIZE = 8 << 20


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    config = tmp_path / "vault.toml"
    config.write_text('[server]\nshutdown_timeout = "1s"\n')
    proc = ServerProcess(tmp_path / "data", free_port(), tmp_path / "server.log", config, workers=2)
    try:
        proc.start()
        yield proc
    finally:
        proc.stop()


def _save(server: ServerProcess, data: bytes) -> None:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    auth = {"Authorization": f"Bearer {server.token}"}
    as_json = {**auth, "Content-Type": "application/json"}
    try:
        conn.request("POST", "/v1/namespaces/t/uploads", body="{}", headers=as_json)
        upload = json.loads(conn.getresponse().read())["upload_id"]
        conn.request("PUT", f"/v1/uploads/{upload}/files/big", body=data, headers=auth)
        assert conn.getresponse().read()
        conn.request("POST", f"/v1/uploads/{upload}/commit", body="{}", headers=as_json)
        assert json.loads(conn.getresponse().read())["files"]["big"]["size"] == len(data)
    finally:
        conn.close()


def _stalled_download(server: ServerProcess) -> socket.socket:
    """A download whose client reads its first bytes and then nothing."""
    sock = socket.create_connection((server.host, server.port), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(
        b"GET /v1/namespaces/t/checkpoints/latest/files/big HTTP/1.1\r\nHost: x\r\n"
        + f"Authorization: Bearer {server.token}\r\n\r\n".encode()
    )
    assert sock.recv(12).startswith(b"HTTP/1.1 200")
    return sock


@pytest.mark.slow  # five server starts: 23-35 s measured on a loaded 2-core machine
def test_sigterm_with_downloads_in_flight_is_quiet(server: ServerProcess) -> None:
    _save(server, os.urandom(SIZE))
    for n in range(ROUNDS):
        if n:
            server.start()
        readers = [_stalled_download(server) for _ in range(READERS)]
        try:
            assert server.terminate() == 0, server.log_tail()
        finally:
            for sock in readers:
                sock.close()
    text = server.log_path.read_text()
    assert "InvalidStateError" not in text
    assert "Traceback" not in text, text[text.index("Traceback") - 300 :][:3000]
