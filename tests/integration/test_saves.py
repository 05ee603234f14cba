"""`POST /v1/saves`: several one-request saves in one request, and the client that sends
what waits together (client/coalesce.py), against the real service."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from typing import Any

import pytest

from checkpoint_vault.api.http import PREPARE_ON_LOOP_MAX
from checkpoint_vault.api.keys import RUNTIME, SETTINGS
from checkpoint_vault.client import AsyncVaultClient
from checkpoint_vault.protocol import MAX_SAVES, SAVES_TYPE, encode_bundle
from checkpoint_vault.vault import FakeClock

from ..conftest import Api, hexhash
from ..serverproc import ServerProcess
from .test_limits import started

HEADERS = {"Content-Type": SAVES_TYPE}
BOUND = 20.0  # seconds any step may take: a bound on a hang, never a pace


def bundle(ns: str, files: dict[str, bytes], **header: Any) -> bytes:
    return encode_bundle({"namespace": ns, "chunking": "small", **header}, list(files.items()))


async def test_saves_in_one_request_are_each_made_and_answered_in_order(api: Api) -> None:
    states = [json.dumps({"step": i, "text": "x" * (3000 + i)}).encode() for i in range(3)]
    body = b"".join(
        [
            bundle("agents/a", {"state.json": states[0]}, key="k" * 20, tags=["t1"]),
            bundle("agents/b", {"state.json": states[1]}, metadata={"step": 1}),
            bundle("agents/a", {"state.json": states[2], "empty": b""}),
        ]
    )
    out = await api.json("POST", "/v1/saves", data=body, headers=HEADERS)
    results = out["results"]
    assert [r["status"] for r in results] == [201, 201, 201]
    ids = [r["checkpoint"]["id"] for r in results]
    assert [r["checkpoint"]["namespace"] for r in results] == ["agents/a", "agents/b", "agents/a"]
    assert results[0]["checkpoint"]["tags"] == ["t1"]
    assert results[1]["checkpoint"]["metadata"] == {"step": 1}
    assert results[2]["checkpoint"]["files"]["state.json"]["hash"] == hexhash(states[2])
    for i, (ns, ckpt) in enumerate(zip(["agents/a", "agents/b", "agents/a"], ids, strict=True)):
        assert await api.read(ns, ckpt, "state.json") == states[i]
    # The same body again: the keyed save is found, the others are made anew.
    again = (await api.json("POST", "/v1/saves", data=body, headers=HEADERS))["results"]
    assert [r["status"] for r in again] == [200, 201, 201]
    assert again[0]["checkpoint"]["id"] == ids[0]


async def test_each_save_meets_its_own_refusal_and_changes_nothing_else(api: Api) -> None:
    """Permission, bad options, a missing parent and a missing namespace refuse that save
    alone, with what it would have answered on its own route."""
    writer = await api.token_for("write:mine/*", "read:*", name="w")
    good = b'{"ok": true}'
    body = b"".join(
        [
            bundle("theirs/x", {"s": b"1"}),
            bundle("mine/a", {"s": b"2"}, metadata="not an object"),
            bundle("mine/a", {"s": b"3"}, parent="0" * 26),
            encode_bundle({"chunking": "small"}, [("s", b"4")]),
            bundle("mine/a", {"s": good}),
        ]
    )
    results = (await api.json("POST", "/v1/saves", data=body, headers=HEADERS, token=writer))[
        "results"
    ]
    assert [r["status"] for r in results] == [403, 400, 404, 400, 201]
    assert [r.get("error", {}).get("code") for r in results[:4]] == [
        "forbidden",
        "invalid_request",
        "not_found",
        "invalid_request",
    ]
    listed = await api.json("GET", "/v1/namespaces/mine/a/checkpoints")
    assert [c["id"] for c in listed["checkpoints"]] == [results[4]["checkpoint"]["id"]]
    names = [n["name"] for n in (await api.json("GET", "/v1/namespaces"))["namespaces"]]
    assert names == ["mine/a"]


async def test_a_body_that_cannot_be_taken_apart_saves_nothing(api: Api) -> None:
    one = bundle("agents/a", {"state.json": b"{}"})
    for body, why in (
        (one + one[:-1], "runs past"),
        (one + b"junk", "bundle"),
        (b"", "no saves"),
        (one * (MAX_SAVES + 1), f"more than {MAX_SAVES}"),
    ):
        err = await api.json("POST", "/v1/saves", expect=400, data=body, headers=HEADERS)
        assert err["error"]["code"] == "invalid_request"
        assert why in err["error"]["message"], err
    assert (await api.json("GET", "/v1/stats"))["checkpoints"] == 0


async def test_every_save_is_charged_to_the_rate_limit(
    aiohttp_client: Any, settings: Any, clock: FakeClock
) -> None:
    """A request of five saves spends five requests of the token's allowance: past its
    burst the rest are 429 with when to ask again, not a way round the limit."""
    admin = await started(
        aiohttp_client, settings, clock, requests_per_second=1.0, request_burst=3.0
    )
    token = await admin.token_for("write:*", "read:*", name="agent")
    body = b"".join(bundle(f"a/{i}", {"s": b"%d" % i}) for i in range(5))
    results = (await admin.json("POST", "/v1/saves", data=body, headers=HEADERS, token=token))[
        "results"
    ]
    assert [r["status"] for r in results] == [201, 201, 201, 429, 429]
    assert results[3]["error"]["code"] == "rate_limited"
    assert results[3]["retry_after"] >= 1
    assert (await admin.json("GET", "/v1/stats"))["checkpoints"] == 3


@pytest.mark.slow
async def test_the_client_sends_saves_that_wait_together(two_processes: ServerProcess) -> None:
    """Forty agents saving at once through one client with one request in flight: they
    travel in a few requests, through either process, and each is its own checkpoint with
    its own answer, read back whole."""
    server = two_processes
    async with AsyncVaultClient(server.url, server.token, small_saves_in_flight=1) as vault:
        states = {
            f"agents/{i}": json.dumps({"agent": i, "pad": "y" * i}).encode() for i in range(40)
        }

        async def agent(ns: str) -> str:
            first = await vault.save(ns, {"state.json": b"{}"}, chunking="small")
            second = await vault.save(ns, {"state.json": states[ns]}, parent=first.id)
            assert second.parent == first.id
            return second.id

        ids = await asyncio.gather(*(agent(ns) for ns in states))
        assert vault._small.batches >= 2  # noqa: SLF001 - the figure this test is about
        for (ns, state), ckpt in zip(states.items(), ids, strict=True):
            assert await vault.read_range(ns, ckpt, "state.json", 0, 1 << 20) == state
        assert len(set(ids)) == 40


async def test_small_saves_are_prepared_on_the_loop_large_ones_on_the_pool(api: Api) -> None:
    """With every thread of the worker pool busy, saves of up to PREPARE_ON_LOOP_MAX bytes
    are still answered (cut and hashed on the event loop: handing a few kB to the pool and
    back cost more than the work); a larger one waits for a thread."""
    app = api.client.app
    assert app is not None
    pool = app[RUNTIME].io
    release = threading.Event()
    busy = [pool.submit(release.wait, BOUND) for _ in range(app[SETTINGS].worker_threads)]
    small = os.urandom(8 << 10)  # four in a body stay under the 64 KiB parsed on the loop
    large = os.urandom(PREPARE_ON_LOOP_MAX + 1)
    try:
        waiting = asyncio.create_task(
            api.call("POST", "/v1/saves", data=bundle("big/a", {"f": large}), headers=HEADERS)
        )
        for body in (bundle("small/a", {"f": small}), bundle("small/b", {"f": small}) * 4):
            out = await asyncio.wait_for(
                api.json("POST", "/v1/saves", data=body, headers=HEADERS), BOUND
            )
            assert {r["status"] for r in out["results"]} == {201}
        assert not waiting.done()
    finally:
        release.set()
    resp = await asyncio.wait_for(waiting, BOUND)
    assert (await resp.json())["results"][0]["status"] == 201
    for f in busy:
        f.result(BOUND)


async def test_agent_states_sent_together_are_taken_apart_on_the_loop(api: Api) -> None:
    """With every thread of the worker pool busy, a body of four ~40 kB agent states (well
    past the 64 KiB of JSON the loop parses, but with <1 kB of headers) is still answered:
    what the loop may parse is counted in header bytes, not body bytes. Headers past that
    (large metadata) still wait for the pool."""
    app = api.client.app
    assert app is not None
    pool = app[RUNTIME].io
    release = threading.Event()
    busy = [pool.submit(release.wait, BOUND) for _ in range(app[SETTINGS].worker_threads)]
    state = json.dumps({"messages": ["word " * 8000]}).encode()  # ~40 kB
    heavy = {"notes": "n" * (40 << 10)}  # two such headers: past the loop's 64 KiB
    try:
        waiting = asyncio.create_task(
            api.call(
                "POST",
                "/v1/saves",
                data=bundle("json/a", {"f": b"x"}, metadata=heavy) * 2,
                headers=HEADERS,
            )
        )
        body = b"".join(bundle(f"agents/{i}", {"state.json": state}) for i in range(4))
        assert len(body) > 64 << 10
        out = await asyncio.wait_for(
            api.json("POST", "/v1/saves", data=body, headers=HEADERS), BOUND / 4
        )
        assert [r["status"] for r in out["results"]] == [201] * 4
        assert not waiting.done()
    finally:
        release.set()
    resp = await asyncio.wait_for(waiting, BOUND)
    assert [r["status"] for r in (await resp.json())["results"]] == [201, 201]
    for f in busy:
        f.result(BOUND)
