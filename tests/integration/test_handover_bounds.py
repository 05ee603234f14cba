"""A descriptor hand-over's work is bounded (issue 30, finding 10): a sparse file is read for
body_timeout plus its allocated bytes at body_min_rate, not its size, and the reading stops
when the client that handed it over leaves.

Against a real `ckpt serve` with its local socket: descriptors travel only there. The
sparse file is 1 TiB with no block allocated (reading its zeros would take the server a
quarter of an hour); every wait is on an answer, or on the token's hand-over share coming
free, in bounded loops."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client import local as local_files
from checkpoint_vault.protocol import DESCRIPTOR_TYPE

from ..serverproc import ServerProcess, free_port

TiB = 1 << 40


@pytest.fixture
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    config = tmp_path / "vault.toml"
    config.write_text(f"[server]\n{request.param}\n")
    proc = ServerProcess(
        tmp_path / "data", free_port(), tmp_path / "server.log", config, local_socket=True
    )
    try:
        proc.start()
        yield proc
    finally:
        proc.stop()


def _sparse(tmp_path: Path) -> int:
    path = tmp_path / "sparse.bin"
    with path.open("wb") as f:
        f.truncate(TiB)
    return os.open(path, os.O_RDONLY)


def _upload(server: ServerProcess) -> str:
    with VaultClient(server.url, server.token, progress=False) as vault:
        return vault.begin_upload("l/raw").id


def _hand(server: ServerProcess, upload: str, fd: int) -> tuple[int, dict[str, object]]:
    status, _, payload = local_files.hand_over(
        server.socket_path,
        f"/v1/uploads/{upload}/files/f.bin",
        {"Authorization": f"Bearer {server.token}"},
        fd,
        0,
        60,
    )
    return status, json.loads(payload)


@pytest.mark.slow
@pytest.mark.parametrize("server", ['body_timeout = "1s"'], indirect=True)
def test_a_sparse_file_is_read_for_its_allocated_bytes_only(
    server: ServerProcess, tmp_path: Path
) -> None:
    fd = _sparse(tmp_path)
    try:
        status, answer = _hand(server, _upload(server), fd)
    finally:
        os.close(fd)
    assert status == 408, answer
    assert "not done within" in json.dumps(answer)


@pytest.mark.parametrize("server", ["handovers_per_token = 1"], indirect=True)
def test_a_hand_over_stops_when_its_client_leaves(server: ServerProcess, tmp_path: Path) -> None:
    """The client hands the sparse file over and hangs up; its one hand-over thread must
    come free (the next hand-over of the token is served) long before the 1 TiB is read."""
    upload = _upload(server)
    fd = _sparse(tmp_path)
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(30)
            sock.connect(server.socket_path)
            sock.sendall(
                f"PUT /v1/uploads/{upload}/files/gone.bin HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {server.token}\r\nContent-Type: {DESCRIPTOR_TYPE}\r\n"
                "Content-Length: 1\r\nExpect: 100-continue\r\n\r\n".encode()
            )
            assert sock.recv(25) == b"HTTP/1.1 100 Continue\r\n\r\n"
            socket.send_fds(sock, [b"\0"], [fd])
    finally:
        os.close(fd)
    (tmp_path / "small.bin").write_bytes(b"small")
    small = os.open(tmp_path / "small.bin", os.O_RDONLY)
    try:
        statuses = []
        for _ in range(300):  # bounded: until the share is free (each refusal is at once)
            status, _ = _hand(server, upload, small)
            statuses.append(status)
            if status != 429:
                break
            time.sleep(0.1)  # pacing the retries, as Retry-After would
    finally:
        os.close(small)
    assert statuses[-1] == 201, statuses
