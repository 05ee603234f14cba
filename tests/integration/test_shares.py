"""No tenant can stall another through the receiver threads (issue 30, finding 1): a body
dripped a byte at a time is cut once it falls below the minimum rate, and a token holding
its share of receivers is refused its next large body while another token is served.

Against the real app on a loopback port: the receivers take the socket itself, which only a
real connection exercises. The drip is paced; every wait is on the server's answer or on
the count of threads the token holds, in bounded loops."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any

import pytest

from checkpoint_vault.api import Settings, create_app
from checkpoint_vault.api.keys import BODY_READERS
from checkpoint_vault.protocol import CHUNK_BATCH_TYPE, encode_chunk_batch
from checkpoint_vault.vault import FakeClock
from checkpoint_vault.vault.frame import chunk_id

from ..conftest import Api

MiB = 1 << 20
DRIP_PACE = 0.2  # seconds between dripped bytes: well under the body_timeout below
DRIPS = 150  # bounded: 30 s of drip, ten times the deadline the rate gives


def _batch(n: int, size: int = 512 << 10) -> bytes:
    chunks = [os.urandom(size) for _ in range(n)]
    return b"".join(bytes(p) for p in encode_chunk_batch([(chunk_id(c), c) for c in chunks]))


async def _app(aiohttp_client: Any, settings: Settings, clock: FakeClock, **changes: Any) -> Api:
    client = await aiohttp_client(create_app(dataclasses.replace(settings, **changes), clock))
    return Api(client, (settings.data_dir / "admin.token").read_text().strip(), settings.data_dir)


async def _dripped(api: Api, upload_id: str, length: int) -> Any:
    """A chunk batch declaring `length` bytes of which 100 are sent."""
    path = f"/v1/uploads/{upload_id}/chunks"
    return await api.raw("POST", path, b"\0" * 100, {"Content-Type": CHUNK_BATCH_TYPE}, length)


@pytest.mark.slow
async def test_a_body_below_the_minimum_rate_is_cut_with_408(
    aiohttp_client: Any, settings: Settings, clock: FakeClock
) -> None:
    """A byte every 0.2 s never trips the 1 s idle timer; 2 MiB at 1 MiB/s plus that second
    gives the body 3 s in all, after which the server answers 408 and closes."""
    api = await _app(aiohttp_client, settings, clock, body_timeout=1.0, body_min_rate=MiB)
    up = await api.open("drip")
    reader, writer = await _dripped(api, up["upload_id"], 2 * MiB)
    answer = b""
    try:
        for _ in range(DRIPS):
            try:
                answer = await asyncio.wait_for(reader.read(4096), DRIP_PACE)
                break
            except TimeoutError:
                writer.write(b"\0")  # the pace of the drip, not a synchronisation
                await writer.drain()
        answer += await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
    assert b"bytes/s" in answer
    assert api.client.app[BODY_READERS].receivers.held("admin") == 0


async def _until_held(api: Api, name: str, count: int) -> None:
    readers = api.client.app[BODY_READERS]
    for _ in range(500):  # bounded: until the receivers hold the dripped bodies
        if readers.receivers.held(name) == count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{name} holds {readers.receivers.held(name)} receivers, not {count}")


async def test_a_token_past_its_receiver_share_is_refused_and_another_is_served(
    aiohttp_client: Any, settings: Settings, clock: FakeClock
) -> None:
    api = await _app(aiohttp_client, settings, clock, receivers_per_token=2)
    dripper = Api(api.client, await api.token_for("write:*", name="dripper"), api.data_dir)
    other = await api.token_for("write:*", "read:*", name="other")
    held = []
    try:
        for _ in range(2):
            up = await dripper.open("a")
            held.append(await _dripped(dripper, up["upload_id"], 2 * MiB))
        await _until_held(api, "dripper", 2)
        # Its third large body: refused at once, unread, and told when to ask again.
        up = await dripper.open("a")
        reader, writer = await _dripped(dripper, up["upload_id"], 2 * MiB)
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 429"), answer[:300]
        assert b"Retry-After: 1\r\n" in answer
        assert b"receiver threads" in answer
        # Another tenant's batch finds a receiver while the dripper's bodies still hold theirs.
        up = await api.json("POST", "/v1/namespaces/b/uploads", 201, json={}, token=other)
        body = _batch(4)
        resp = await api.call(
            "POST",
            f"/v1/uploads/{up['upload_id']}/chunks",
            token=other,
            data=body,
            headers={"Content-Type": CHUNK_BATCH_TYPE},
        )
        assert resp.status == 200, await resp.text()
        assert api.client.app[BODY_READERS].receivers.held("dripper") == 2
    finally:
        for _, w in held:
            w.close()
    await _until_held(api, "dripper", 0)  # the cut connections give their threads back
