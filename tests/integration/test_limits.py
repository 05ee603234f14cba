"""Input limits and no 500s from input (issue 16, #5, #8, #10), against the real service."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from checkpoint_vault.api import Settings, create_app
from checkpoint_vault.api.settings import load_settings
from checkpoint_vault.vault import FakeClock

from ..conftest import Api, hexhash


async def started(
    aiohttp_client: Any, settings: Settings, clock: FakeClock, vault: Any = None, **top: Any
) -> Api:
    """The service with these settings changed (`vault`: engine settings), as admin."""
    changed = dataclasses.replace(settings, **top)
    if vault:
        changed = dataclasses.replace(changed, vault=dataclasses.replace(settings.vault, **vault))
    client = await aiohttp_client(create_app(changed, clock))
    return Api(client, (settings.data_dir / "admin.token").read_text().strip(), settings.data_dir)


async def test_json_bombs_are_refused_and_health_stays_fast(api: Api) -> None:
    """A body of `[],` used to cost 860 MB and block the event loop for seconds; deep
    nesting answered 500 with a traceback per request."""
    bomb = b'{"metadata": {"x": [' + b"[]," * 300_000 + b"[]]}}"
    deep = b'{"metadata": {"x": ' + b"[" * 5000 + b"]" * 5000 + b"}}"

    async def flood() -> list[int]:
        codes = []
        for body in (bomb, deep) * 3:
            resp = await api.call("POST", "/v1/namespaces/n/uploads", data=body)
            codes.append(resp.status)
            error = (await resp.json())["error"]
            assert error["code"] in ("too_large", "invalid_request"), error
        return codes

    codes, worst = await asyncio.gather(flood(), api.worst_health())
    assert codes == [413, 400] * 3
    assert worst < 1.0, f"health took {worst:.3f} s during the flood"


async def test_nan_infinity_and_deep_metadata_are_400(api: Api) -> None:
    for text in ('{"metadata": {"loss": NaN}}', '{"metadata": {"x": -Infinity}}'):
        resp = await api.call("POST", "/v1/namespaces/n/uploads", data=text.encode())
        assert resp.status == 400
        assert (await resp.json())["error"]["code"] == "invalid_request"
    nested: object = 1
    for _ in range(40):
        nested = [nested]
    await api.call("POST", "/v1/namespaces/n/uploads", json={"metadata": {"x": nested}}, expect=400)
    big = {"blob": "x" * (65 << 10)}
    resp = await api.call("POST", "/v1/namespaces/n/uploads", json={"metadata": big}, expect=413)
    assert (await resp.json())["error"]["code"] == "too_large"
    # the one-request save's header is checked the same way
    listing = await api.json("GET", "/v1/namespaces")
    assert listing["namespaces"] == []  # nothing was created by any of it


async def test_huge_range_is_416_not_500(api: Api) -> None:
    await api.save("r", {"f": b"0123456789"})
    for header in ("bytes=" + "9" * 5000 + "-", "bytes=0-" + "9" * 5000, "bytes=-" + "9" * 5000):
        resp = await api.call(
            "GET", "/v1/namespaces/r/checkpoints/latest/files/f", headers={"Range": header}
        )
        body = await resp.read()
        if header.startswith("bytes=0-") or header.startswith("bytes=-"):
            assert (resp.status, body) == (206, b"0123456789"), header[:20]
        else:
            assert resp.status == 416, header[:20]


async def test_a_file_of_tiny_chunks_is_refused(api: Api) -> None:
    """400,000 8-byte chunks made a 42 MB manifest; now a file may list at most 4096 chunks
    plus one per 256 bytes."""
    up = await api.open("t")
    pieces = [i.to_bytes(8, "big") for i in range(5000)]
    batch = b"".join(bytes.fromhex(hexhash(p)) + len(p).to_bytes(4, "little") + p for p in pieces)
    await api.call("POST", f"/v1/uploads/{up['upload_id']}/chunks", data=batch, expect=200)
    data = b"".join(pieces)
    files = {
        "f": {"size": len(data), "hash": hexhash(data), "chunks": [hexhash(p) for p in pieces]}
    }
    resp = await api.call("POST", f"/v1/uploads/{up['upload_id']}/commit", json={"files": files})
    assert resp.status == 413
    assert "chunks for 40000 bytes" in (await resp.json())["error"]["message"]
    assert json.loads(await (await api.call("GET", "/v1/stats")).read())["checkpoints"] == 0


async def test_upload_sessions_are_limited_per_token(
    aiohttp_client: Any, settings: Settings, clock: FakeClock
) -> None:
    """#4: one token opened 9,699 sessions and everyone else got 429 for 6 h."""
    admin = await started(
        aiohttp_client, settings, clock, vault={"max_upload_sessions_per_token": 3}
    )
    flood = await admin.token_for("write:a/*", name="flood")
    other = await admin.token_for("write:b/*", name="other")
    opened = [
        (await admin.json("POST", "/v1/namespaces/a/x/uploads", 201, token=flood, json={}))[
            "upload_id"
        ]
        for _ in range(3)
    ]
    resp = await admin.call("POST", "/v1/namespaces/a/x/uploads", token=flood, json={}, expect=429)
    assert (await resp.json())["error"]["code"] == "too_many_uploads"
    assert resp.headers["Retry-After"]
    await admin.json("POST", "/v1/namespaces/b/x/uploads", 201, token=other, json={})
    listing = await admin.json("GET", "/v1/admin/uploads?token=flood")
    assert sorted(u["upload_id"] for u in listing["uploads"]) == sorted(opened)
    assert listing["by_token"] == {"flood": 3, "other": 1}
    await admin.call("GET", "/v1/admin/uploads", token=other, expect=403)
    await admin.call("DELETE", f"/v1/admin/uploads/{opened[0]}", expect=204)
    await admin.json("POST", "/v1/namespaces/a/x/uploads", 201, token=flood, json={})


async def test_a_stalled_body_times_out(
    aiohttp_client: Any, settings: Settings, clock: FakeClock
) -> None:
    """#7: a body at 1 byte per 15 s was still open after 182 s. Now the server waits
    `server.body_timeout` for each next byte, answers 408 and closes the connection."""
    admin = await started(aiohttp_client, settings, clock, body_timeout=0.3)
    up = await admin.open("slow")
    for method, path in (
        ("PUT", f"/v1/uploads/{up['upload_id']}/files/f"),
        ("POST", "/v1/namespaces/slow/uploads"),
    ):
        reader, writer = await admin.raw(method, path, b"{", content_length=1000)
        sent = time.perf_counter()
        answer = await asyncio.wait_for(reader.read(), 30)  # until the server closes
        waited = time.perf_counter() - sent
        writer.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b'"body_timeout"' in answer
        assert waited < 15, waited
    assert (await admin.client.get("/v1/health")).status == 200


async def test_request_rate_is_limited_per_token(
    aiohttp_client: Any, settings: Settings, clock: FakeClock
) -> None:
    """A flooding token gets 429 + Retry-After; other tokens and admins carry on."""
    admin = await started(
        aiohttp_client, settings, clock, requests_per_second=2.0, request_burst=3.0
    )
    flood = await admin.token_for("read:*", name="flood")
    calm = await admin.token_for("read:*", name="calm")
    for _ in range(3):
        await admin.call("GET", "/v1/namespaces", token=flood, expect=200)
    resp = await admin.call("GET", "/v1/namespaces", token=flood, expect=429)
    assert (await resp.json())["error"]["code"] == "rate_limited"
    assert resp.headers["Retry-After"] == "1"
    await admin.call("GET", "/v1/namespaces", token=calm, expect=200)
    for _ in range(10):
        await admin.call("GET", "/v1/namespaces", expect=200)  # admin: not limited
    clock.advance(0.5)
    await admin.call("GET", "/v1/namespaces", token=flood, expect=200)
    await admin.call("GET", "/v1/namespaces", token=flood, expect=429)


async def test_storage_quota_per_namespace_glob(
    aiohttp_client: Any, settings: Settings, clock: FakeClock, tmp_path: Path
) -> None:
    """#5: 120 MiB uploaded by one tenant and nothing bounded it. A [quotas] glob now
    bounds the logical bytes its namespaces hold: 507 quota_exceeded past it."""
    config = tmp_path / "ckpt.toml"
    config.write_text('[quotas]\n"ns-a/*" = 100000\n')
    quotas = load_settings(config, environ={}).vault.quotas
    admin = await started(aiohttp_client, settings, clock, vault={"quotas": quotas})
    first = await admin.save("ns-a/one", {"f": os.urandom(60_000)})
    up = await admin.open("ns-a/two")
    await admin.call(
        "PUT", f"/v1/uploads/{up['upload_id']}/files/f", data=os.urandom(60_000), expect=201
    )
    resp = await admin.call("POST", f"/v1/uploads/{up['upload_id']}/commit", json={}, expect=507)
    assert (await resp.json())["error"]["code"] == "quota_exceeded"
    await admin.save("ns-b/x", {"f": os.urandom(60_000)})  # other tenants unaffected
    stats = await admin.json("GET", "/v1/stats")
    assert stats["quotas"] == [{"glob": "ns-a/*", "limit": 100_000, "used": 60_000}]
    metrics = await (await admin.call("GET", "/metrics", expect=200)).text()
    assert 'ckpt_quota_bytes{glob="ns-a/*",kind="used"} 60000.0' in metrics
    await admin.call("DELETE", f"/v1/namespaces/ns-a/one/checkpoints/{first['id']}", expect=204)
    await admin.call("POST", f"/v1/uploads/{up['upload_id']}/commit", json={}, expect=201)


async def test_uncommitted_bytes_are_limited_per_token(
    aiohttp_client: Any, settings: Settings, clock: FakeClock
) -> None:
    """#5: 120 MiB uploaded and never committed stayed for 6 h, GC freeing nothing."""
    admin = await started(
        aiohttp_client, settings, clock, vault={"max_pending_bytes_per_token": 100_000}
    )
    w = await admin.token_for("write:t/*", name="w")
    first = await admin.json("POST", "/v1/namespaces/t/a/uploads", 201, token=w, json={})
    await admin.call(
        "PUT",
        f"/v1/uploads/{first['upload_id']}/files/f",
        token=w,
        data=os.urandom(60_000),
        expect=201,
    )
    second = await admin.json("POST", "/v1/namespaces/t/b/uploads", 201, token=w, json={})
    data = os.urandom(60_000)
    batch = bytes.fromhex(hexhash(data)) + len(data).to_bytes(4, "little") + data
    resp = await admin.call(
        "POST", f"/v1/uploads/{second['upload_id']}/chunks", token=w, data=batch, expect=507
    )
    assert (await resp.json())["error"]["code"] == "quota_exceeded"
    listing = await admin.json("GET", "/v1/admin/uploads?token=w")
    assert sorted(u["pending_bytes"] for u in listing["uploads"]) == [0, 60_000]
    metrics = await (await admin.call("GET", "/metrics", expect=200)).text()
    assert 'ckpt_token_uploads{kind="pending_bytes",token="w"} 60000.0' in metrics
    assert 'ckpt_token_uploads{kind="sessions",token="w"} 2.0' in metrics
    await admin.call("DELETE", f"/v1/uploads/{first['upload_id']}", token=w, expect=204)
    out = await admin.json("POST", f"/v1/uploads/{second['upload_id']}/chunks", token=w, data=batch)
    assert out["created"] == 1
    await admin.call(
        "POST",
        f"/v1/uploads/{second['upload_id']}/commit",
        token=w,
        expect=201,
        json={"files": {"g": {"size": 60_000, "hash": hexhash(data), "chunks": [hexhash(data)]}}},
    )
    big = os.urandom(120_000)  # alone over the limit: refused, nothing stored
    third = await admin.json("POST", "/v1/namespaces/t/c/uploads", 201, token=w, json={})
    await admin.call(
        "PUT", f"/v1/uploads/{third['upload_id']}/files/f", token=w, data=big, expect=507
    )
