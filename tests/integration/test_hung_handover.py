"""A file handed over whose read never returns (issue 41, low): a client on this machine
hands the server a descriptor of a file on a FUSE mount that stopped answering. The server
waited for the read for ever and answered nothing; now it answers 408 `request_timeout`
once the job made no progress for body_timeout plus a piece at body_min_rate, and leaves
the blocked thread (which ends when the file system answers). Against a real `ckpt serve`
over a real FUSE mount (tests/hungfs.py; skipped where mounting is refused)."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.client import local

from ..hungfs import HungFile
from ..serverproc import ServerProcess, free_port

WAIT = 20.0  # seconds the client waits for an answer: before, none ever came


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    config = tmp_path / "vault.toml"
    # No progress for 1 s plus 8 MiB at 1 GiB/s is a stall; the whole 1 TiB file would
    # have had 1 s plus 1024 s.
    config.write_text('[server]\nbody_timeout = "1s"\nbody_min_rate = "1GiB"\n')
    proc = ServerProcess(
        tmp_path / "data", free_port(), tmp_path / "server.log", config, local_socket=True
    )
    try:
        proc.start()
        yield proc
    finally:
        proc.stop()


def _open_upload(server: ServerProcess) -> str:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        conn.request(
            "POST",
            "/v1/namespaces/hung/uploads",
            body="{}",
            headers={"Authorization": f"Bearer {server.token}", "Content-Type": "application/json"},
        )
        return str(json.loads(conn.getresponse().read())["upload_id"])
    finally:
        conn.close()


@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_a_hung_read_is_answered_408_request_timeout(
    server: ServerProcess, tmp_path: Path
) -> None:
    headers = {"Authorization": f"Bearer {server.token}"}
    with HungFile.mount(tmp_path / "mnt", 1 << 40) as hung:
        upload = _open_upload(server)
        started = time.monotonic()
        fd = os.open(hung.path, os.O_RDONLY)
        try:  # its size not given: the client's wait is WAIT, not one for 1 TiB
            status, _, body = await asyncio.to_thread(
                local.hand_over,
                server.socket_path,
                f"/v1/uploads/{upload}/files/f",
                headers,
                fd,
                0,
                WAIT,
            )
        finally:
            os.close(fd)  # while the file system still answers (a flush)
        took = time.monotonic() - started
        assert hung.reads > 0  # the server did block in the file system
        assert status == 408, body[:300]
        error = json.loads(body)["error"]
        assert error["code"] == "request_timeout"
        assert "no progress" in error["message"]
        assert took < 10
        hung.release()  # the file system answers (EIO): the left thread ends
        for _ in range(200):  # bounded: until the server let go of the file
            if not server.holds_open(hung.path):
                break
            await asyncio.sleep(0.05)
        assert not server.holds_open(hung.path)
    assert server.terminate() == 0
    assert "Traceback" not in server.log_path.read_text()
