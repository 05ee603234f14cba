"""SIGTERM while an upload streams: the server finishes or aborts it cleanly and exits 0."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import time
from pathlib import Path

import aiohttp
import pytest

from checkpoint_vault.client import local
from checkpoint_vault.client.connections import Broken

from ..serverproc import ServerProcess


@pytest.mark.slow
async def test_sigterm_exits_zero_and_keeps_committed_data(crash_server: ServerProcess) -> None:
    headers = {"Authorization": f"Bearer {crash_server.token}"}
    data = os.urandom(3 << 20)
    async with aiohttp.ClientSession(crash_server.url, headers=headers) as http:
        async with http.post("/v1/namespaces/term/uploads", json={}) as resp:
            upload = (await resp.json())["upload_id"]
        async with http.put(f"/v1/uploads/{upload}/files/a", data=io.BytesIO(data)) as resp:
            assert resp.status == 201
        async with http.post(f"/v1/uploads/{upload}/commit", json={}) as resp:
            record = await resp.json()
        async with http.post("/v1/namespaces/term/uploads", json={}) as resp:
            pending = (await resp.json())["upload_id"]

        async def slow_body() -> object:
            for _ in range(50):
                yield os.urandom(1 << 16)
                await asyncio.sleep(0)

        in_flight = asyncio.ensure_future(
            http.put(f"/v1/uploads/{pending}/files/b", data=slow_body())
        )
        await asyncio.sleep(0)
        code = await asyncio.get_running_loop().run_in_executor(None, crash_server.terminate)
        assert code == 0, crash_server.log_tail()
        try:
            answered = await in_flight
        except aiohttp.ClientError:
            pass  # aborted by shutdown: never committed
        else:
            status = answered.status
            answered.release()
            assert status in (201, 503), f"the upload in flight was answered {status}"
    assert "Traceback" not in crash_server.log_path.read_text()
    crash_server.start()
    async with aiohttp.ClientSession(crash_server.url, headers=headers) as http:
        path = f"/v1/namespaces/term/checkpoints/{record['id']}/files/a"
        async with http.get(path) as resp:
            assert await resp.read() == data
        async with http.get("/v1/namespaces/term/checkpoints") as resp:
            assert [r["id"] for r in (await resp.json())["checkpoints"]] == [record["id"]]


async def test_log_lines_are_json_with_request_ids(crash_server: ServerProcess) -> None:
    headers = {"Authorization": f"Bearer {crash_server.token}", "X-Request-Id": "log-check-1"}
    async with (
        aiohttp.ClientSession(crash_server.url, headers=headers) as http,
        http.get("/v1/namespaces/missing/checkpoints/latest") as resp,
    ):
        assert resp.status == 404
    assert crash_server.terminate() == 0
    lines = [ln for ln in crash_server.log_path.read_text().splitlines() if ln.startswith("{")]
    records = [json.loads(ln) for ln in lines]
    assert records, "no JSON log lines"
    access = [r for r in records if r.get("request_id") == "log-check-1"]
    assert len(access) == 1
    assert access[0]["status"] == 404
    assert access[0]["logger"] == "ckpt.access"
    # The line the worker writes itself is the one logging's JsonFormatter wrote.
    assert list(access[0]) == [
        "ts", "level", "logger", "msg", "request_id", "method", "path", "status",
        "bytes_out", "ms", "remote", "pid",
    ]  # fmt: skip
    assert access[0]["msg"] == "GET /v1/namespaces/missing/checkpoints/latest 404"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", access[0]["ts"])
    assert access[0]["level"] == "info"
    assert access[0]["remote"] == "127.0.0.1"
    assert isinstance(access[0]["pid"], int)
    assert isinstance(access[0]["bytes_out"], int)
    assert all({"ts", "level", "logger", "msg"} <= set(r) for r in records)


@pytest.mark.slow
async def test_sigterm_stops_a_file_being_handed_over(
    crash_server: ServerProcess, tmp_path: Path
) -> None:
    """A file handed over by descriptor is read by a worker, not the event loop: shutdown
    must stop that read at its next piece (it would otherwise hold the exit for as long as
    the file takes) and attach nothing, and the worker must still close the file."""
    sparse = tmp_path / "huge.bin"
    with sparse.open("wb") as f:
        f.truncate(256 << 30)  # reads fast (holes), but far longer than a shutdown may take
    headers = {"Authorization": f"Bearer {crash_server.token}"}
    async with (
        aiohttp.ClientSession(crash_server.url, headers=headers) as http,
        http.post("/v1/namespaces/term/uploads", json={}) as resp,
    ):
        upload = (await resp.json())["upload_id"]
    handing = asyncio.ensure_future(
        asyncio.to_thread(
            local.hand_over_file,
            crash_server.socket_path,
            f"/v1/uploads/{upload}/files/huge.bin",
            headers,
            sparse,
            60,
        )
    )
    for _ in range(400):  # bounded: until the server holds the file open
        if crash_server.holds_open(sparse):
            break
        await asyncio.sleep(0.025)
    else:
        raise AssertionError("the server never opened the file handed over")
    started = time.monotonic()
    code = await asyncio.get_running_loop().run_in_executor(None, crash_server.terminate)
    assert code == 0, crash_server.log_tail()
    assert time.monotonic() - started < 15
    with contextlib.suppress(Broken):
        status, _, _ = await handing
        assert status == 503
    assert "Traceback" not in crash_server.log_path.read_text()
    crash_server.start()
    async with (
        aiohttp.ClientSession(crash_server.url, headers=headers) as http,
        http.post(f"/v1/uploads/{upload}/commit", json={}) as resp,
    ):
        assert resp.status == 201, await resp.text()
        assert (await resp.json())["files"] == {}  # nothing of the file was attached
