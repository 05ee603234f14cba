"""A small body dripped slower than `server.body_min_rate` is answered 408 (issue 41,
finding 2): small bodies, read on the event loop, had only the idle timer, so a byte every
20 s held a connection (and, through a worker, one of the writing process's descriptors)
for ever. Against a real `ckpt serve`, with one process (the body read where it is
answered) and with workers (the body read by the worker before it forwards it)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.client import RetryPolicy, VaultClient

from ..serverproc import ServerProcess, free_port

IDLE = 1.0  # seconds: server.body_timeout
DRIP = 0.3  # seconds between bytes: never idle that long
WAIT = 10.0  # seconds the drip may last: a bound, not a pace
LENGTH = 1000  # the body's announced length: it would take 300 s at this drip


@pytest.fixture(params=[1, 2], ids=["one-process", "workers"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    config = tmp_path / "vault.toml"
    config.write_text(f'[server]\nbody_timeout = "{IDLE:g}s"\nbody_min_rate = "1KiB"\n')
    proc = ServerProcess(
        tmp_path / "data", free_port(), tmp_path / "server.log", config, workers=request.param
    )
    try:
        proc.start()
        yield proc
    finally:
        proc.stop()


@pytest.mark.slow
def test_a_small_body_slower_than_the_minimum_rate_is_cut(server: ServerProcess) -> None:
    with VaultClient(server.url, server.token, retry=RetryPolicy(attempts=1)) as admin:
        token = admin.create_token("drip", ["write:drip"]).token
    head = (
        f"POST /v1/namespaces/drip/uploads HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {LENGTH}\r\n\r\n"
    ).encode()
    with socket.create_connection((server.host, server.port), timeout=WAIT) as sock:
        sock.sendall(head)
        start = time.monotonic()
        answer = b""
        sock.settimeout(DRIP)
        while time.monotonic() - start < WAIT and not answer:
            try:
                sock.sendall(b" ")
                answer = sock.recv(64)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        took = time.monotonic() - start
    print(f"answer {answer[:12]!r} after {took:.1f} s")
    assert answer.startswith(b"HTTP/1.1 408"), (answer, took)
