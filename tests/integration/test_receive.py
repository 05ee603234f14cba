"""Large chunk batches are received on a thread, past aiohttp's parser: every byte must
still arrive in order, the connection must end with the answer (its parser never saw the
body), and a body cut short, stalled or abandoned at shutdown must store nothing and hold
no thread."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket
import threading
import time
from typing import Any

import pytest

from checkpoint_vault.api import Settings, create_app
from checkpoint_vault.api.keys import BODY_READERS, RUNTIME, SETTINGS, VAULT
from checkpoint_vault.protocol import CHUNK_BATCH_TYPE, DESCRIPTOR_TYPE, encode_chunk_batch
from checkpoint_vault.vault import FakeClock
from checkpoint_vault.vault.frame import chunk_id

from ..conftest import Api

MiB = 1 << 20
NOBODY = 65534  # the uid of the user nobody


def _batch(n: int, size: int = 512 << 10) -> tuple[list[bytes], bytes]:
    """`n` random chunks and their batch body (well over the receivers' threshold)."""
    chunks = [os.urandom(size) for _ in range(n)]
    body = b"".join(bytes(p) for p in encode_chunk_batch([(chunk_id(c), c) for c in chunks]))
    return chunks, body


async def _missing(api: Api, upload_id: str, chunks: list[bytes]) -> set[str]:
    ids = [chunk_id(c).hex() for c in chunks]
    answer = await api.json("POST", f"/v1/uploads/{upload_id}/missing", json={"chunks": ids})
    return set(answer["missing"])


async def _raw(api: Api, upload_id: str, content_length: int, body: bytes) -> tuple[Any, Any]:
    """A chunk batch that sends `body`, maybe less than `content_length`."""
    headers = {"Content-Type": CHUNK_BATCH_TYPE}
    path = f"/v1/uploads/{upload_id}/chunks"
    return await api.raw("POST", path, body, headers, content_length)


async def test_a_large_batch_arrives_whole_and_closes_its_connection(api: Api) -> None:
    up = await api.open("big")
    chunks, body = _batch(6)
    resp = await api.call(
        "POST",
        f"/v1/uploads/{up['upload_id']}/chunks",
        data=body,
        headers={"Content-Type": CHUNK_BATCH_TYPE},
    )
    assert resp.status == 200, await resp.text()
    assert await resp.json() == {"chunks": 6, "created": 6}
    assert resp.headers["Connection"] == "close"
    assert await _missing(api, up["upload_id"], chunks) == set()
    # The bytes the thread received are the ones stored: the checkpoint reads back exactly.
    listing = {"size": len(b"".join(chunks)), "chunks": [chunk_id(c).hex() for c in chunks]}
    await api.json(
        "POST", f"/v1/uploads/{up['upload_id']}/commit", 201, json={"files": {"f": listing}}
    )
    got = await api.call("GET", "/v1/namespaces/big/checkpoints/latest/files/f", expect=200)
    assert await got.read() == b"".join(chunks)
    # A small batch still goes through the loop and keeps its connection.
    small_chunks, small = _batch(2, 1000)
    resp = await api.call(
        "POST",
        f"/v1/uploads/{(await api.open('big'))['upload_id']}/chunks",
        data=small,
        headers={"Content-Type": CHUNK_BATCH_TYPE},
    )
    assert resp.status == 200
    assert resp.headers.get("Connection", "keep-alive") != "close"


async def test_a_batch_cut_short_stores_nothing(api: Api) -> None:
    up = await api.open("cut")
    chunks, body = _batch(6)
    reader, writer = await _raw(api, up["upload_id"], len(body), body[: 2 * MiB])
    writer.write_eof()  # the client gives up halfway: the receiver sees the end of the stream
    answer = await asyncio.wait_for(reader.read(), 30)  # until the server closes
    writer.close()
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"Content-Length" in answer
    assert await _missing(api, up["upload_id"], chunks) == {chunk_id(c).hex() for c in chunks}


async def test_a_stalled_large_batch_times_out(
    aiohttp_client: Any, settings: Settings, clock: FakeClock
) -> None:
    changed = dataclasses.replace(settings, body_timeout=0.3)
    client = await aiohttp_client(create_app(changed, clock))
    api = Api(client, (settings.data_dir / "admin.token").read_text().strip(), settings.data_dir)
    up = await api.open("slow")
    chunks, body = _batch(6)
    reader, writer = await _raw(api, up["upload_id"], len(body), body[: 2 * MiB])
    sent = time.perf_counter()
    answer = await asyncio.wait_for(reader.read(), 30)
    waited = time.perf_counter() - sent
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert waited < 15, waited
    assert await _missing(api, up["upload_id"], chunks) == {chunk_id(c).hex() for c in chunks}


async def test_shutdown_wakes_a_receiver_waiting_on_a_stalled_client(api: Api) -> None:
    """Shutdown aborts handlers reading bodies; one whose body a receiver thread is taking
    must wake that thread too, or closing its pool would wait out the body timeout (60 s)."""
    up = await api.open("stop")
    chunks, body = _batch(6)
    reader, writer = await _raw(api, up["upload_id"], len(body), body[: 2 * MiB])
    app = api.client.app
    for _ in range(400):  # bounded: until a receiver thread has the body
        if any(t.name.startswith("vault-receive") for t in threading.enumerate()):
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("no receiver thread took the body")
    await app[BODY_READERS].abort_all(app)
    answer = await asyncio.wait_for(reader.read(), 10)  # the connection ends, answered or not
    writer.close()
    assert not answer.startswith(b"HTTP/1.1 2"), answer[:200]
    started = time.perf_counter()
    await asyncio.wait_for(asyncio.to_thread(app[RUNTIME].receive.shutdown, True), 10)
    assert time.perf_counter() - started < 5
    # Requests are refused now (shutting down): ask the engine what the upload holds.
    ids = [chunk_id(c).hex() for c in chunks]
    assert set(await asyncio.to_thread(app[VAULT].uploads.missing, up["upload_id"], ids)) == set(
        ids
    )


async def test_a_descriptor_over_tcp_is_refused(api: Api) -> None:
    """Descriptors travel only on the local socket: over TCP the one-byte body is just a
    byte, and nothing may be stored from it."""
    up = await api.open("fd")
    resp = await api.call(
        "PUT",
        f"/v1/uploads/{up['upload_id']}/files/f.bin",
        data=b"\0",
        headers={"Content-Type": DESCRIPTOR_TYPE},
    )
    assert resp.status == 400, await resp.text()
    assert "local socket" in (await resp.json())["error"]["message"]
    commit = await api.json("POST", f"/v1/uploads/{up['upload_id']}/commit", 201, json={})
    assert commit["files"] == {}


async def test_health_names_the_local_socket_only_on_this_machine(api: Api) -> None:
    health = await api.json("GET", "/v1/health")
    socket = api.client.app[SETTINGS].socket_path
    assert socket is not None, "a data dir path too long for a socket address"
    assert health["local_socket"] == str(socket) == str(api.data_dir.absolute() / "ckpt.sock")
    assert len(health["instance"]) == 16


@pytest.mark.skipif(os.geteuid() != 0, reason="making a socket of another user needs root")
async def test_health_names_no_socket_to_another_user_on_loopback(api: Api) -> None:
    """A reverse proxy on this host makes every remote caller look like loopback; it runs
    as another user, who could not use the socket (in the data dir, 0700) anyway. Its
    connection is made here as `nobody`: health then names no socket."""
    host, port = api.client.server.host, api.client.server.port
    os.seteuid(NOBODY)  # the socket's owner is fixed when it is made
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    finally:
        os.seteuid(0)
    with sock:
        sock.settimeout(10)
        await asyncio.get_running_loop().run_in_executor(None, sock.connect, (host, port))
        request = f"GET /v1/health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        answer = await asyncio.get_running_loop().run_in_executor(None, _exchange, sock, request)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert "local_socket" not in json.loads(body)
    assert (await api.json("GET", "/v1/health"))["local_socket"]  # its own user: named


def _exchange(sock: socket.socket, request: str) -> bytes:
    sock.sendall(request.encode())
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out
