"""Work bounded by what was paid for (issue 30, findings 2, 7 and 15), against the real
service: a commit's size, reference count and read-back are checked before any chunk is
read; session caps are per token with no global cap one tenant can fill; a quota refusal
names the caller's own limit only. Each refusal changes nothing, and the upload session
stays open (the caller may commit a smaller listing or abort)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from checkpoint_vault.api import Settings
from checkpoint_vault.api.keys import VAULT
from checkpoint_vault.api.settings import load_settings
from checkpoint_vault.vault import FakeClock

from ..conftest import Api, hexhash
from .test_limits import started

MIB = 1 << 20


async def stored_chunk(api: Api, ns: str, size: int) -> tuple[str, str, bytes]:
    """An open upload in `ns` that has sent one chunk of `size` random bytes."""
    up = await api.open(ns)
    data = os.urandom(size)
    cid = hexhash(data)
    await api.call("PUT", f"/v1/uploads/{up['upload_id']}/chunks/{cid}", data=data, expect=201)
    return up["upload_id"], cid, data


async def nothing_stored(api: Api) -> None:
    stats = json.loads(await (await api.call("GET", "/v1/stats")).read())
    assert stats["checkpoints"] == 0


async def test_one_chunk_listed_50000_times_is_refused_before_it_is_read(
    aiohttp_client: Any, settings: Settings, clock: FakeClock
) -> None:
    """#2: one stored 4 MiB chunk listed 50,000 times (a 3.4 MB body) made the server read
    and hash 195 GiB before any check. Now 413 naming the read-back limit, at once; the
    session stays open and commits the honest listing after. Default limits."""
    api = await started(aiohttp_client, settings, clock, vault={"max_chunk_size": 4 * MIB})
    upload_id, cid, _ = await stored_chunk(api, "amp/a", 4 * MIB)
    files = {"f": {"size": 50_000 * 4 * MIB, "chunks": [cid] * 50_000}}
    body = json.dumps({"files": files}).encode()  # bytes: sent as a stream, not in one write
    headers = {"Content-Type": "application/json"}
    resp = await api.call("POST", f"/v1/uploads/{upload_id}/commit", data=body, headers=headers)
    assert resp.status == 413, await resp.text()
    error = (await resp.json())["error"]
    assert error["code"] == "too_large"
    assert "uploads.max_commit_read_back_bytes" in error["message"]
    await nothing_stored(api)
    files = {"f": {"size": 4 * MIB, "chunks": [cid]}}
    await api.json("POST", f"/v1/uploads/{upload_id}/commit", 201, json={"files": files})


async def test_reference_count_and_logical_size_are_limited(
    aiohttp_client: Any, settings: Settings, clock: FakeClock
) -> None:
    """The reference count and the checkpoint's logical size are checked from the body,
    each refusal naming its setting; a refused commit leaves the session open to abort."""
    admin = await started(
        aiohttp_client,
        settings,
        clock,
        vault={"max_commit_chunks": 100, "max_checkpoint_bytes": 10 * MIB},
    )
    upload_id, cid, _ = await stored_chunk(admin, "amp/b", 64 << 10)
    files = {"f": {"size": 101 * (64 << 10), "chunks": [cid] * 101}}
    resp = await admin.call("POST", f"/v1/uploads/{upload_id}/commit", json={"files": files})
    assert resp.status == 413
    assert "uploads.max_commit_chunks" in (await resp.json())["error"]["message"]
    files = {"f": {"size": 11 * MIB, "chunks": [cid] * 11}}  # refused before any lookup
    resp = await admin.call("POST", f"/v1/uploads/{upload_id}/commit", json={"files": files})
    assert resp.status == 413
    assert "uploads.max_checkpoint_bytes" in (await resp.json())["error"]["message"]
    await nothing_stored(admin)
    await admin.call("DELETE", f"/v1/uploads/{upload_id}", expect=204)


async def test_read_back_within_the_limit_is_accepted_and_proven(
    aiohttp_client: Any, settings: Settings, clock: FakeClock
) -> None:
    """Under the limit a repeated chunk is still a valid file: hashed once, and a second
    file identical to it is proven by that one read (no second pass)."""
    admin = await started(
        aiohttp_client, settings, clock, vault={"max_commit_read_back_bytes": 1 * MIB}
    )
    upload_id, cid, data = await stored_chunk(admin, "amp/c", 64 << 10)
    same = {"size": 16 * (64 << 10), "chunks": [cid] * 16}
    rec = await admin.json(
        "POST", f"/v1/uploads/{upload_id}/commit", 201, json={"files": {"f": same, "g": same}}
    )
    whole = {"size": 16 * len(data), "hash": hexhash(data * 16)}
    assert rec["files"] == {"f": whole, "g": whole}
    resp = await admin.call("GET", f"/v1/namespaces/amp/c/checkpoints/{rec['id']}/files/g")
    assert await resp.read() == data * 16


async def test_a_quota_refusal_names_the_callers_limit_only(
    aiohttp_client: Any, settings: Settings, clock: FakeClock, tmp_path: Path
) -> None:
    """#15: the 507 reported the usage of a glob other tenants may share. It now names the
    quota only, and is answered from the listed sizes before anything is read."""
    config = tmp_path / "ckpt.toml"
    config.write_text('[quotas]\n"team-*" = 1000000\n')
    quotas = load_settings(config, environ={}).vault.quotas
    admin = await started(aiohttp_client, settings, clock, vault={"quotas": quotas})
    await admin.save("team-other/x", {"f": os.urandom(300_000)})  # another tenant's use
    upload_id, cid, _ = await stored_chunk(admin, "team-mine/x", 100_000)
    files = {"f": {"size": 800_000, "chunks": [cid] * 8}}
    resp = await admin.call("POST", f"/v1/uploads/{upload_id}/commit", json={"files": files})
    assert resp.status == 507
    message = (await resp.json())["error"]["message"]
    assert "1000000-byte" in message
    assert "'team-mine/x'" in message
    assert "team-*" not in message
    assert "300000" not in message
    records = await admin.json("GET", "/v1/namespaces/team-mine/x/checkpoints")
    assert records["checkpoints"] == []


async def test_session_caps_are_per_token_with_no_global_cap(
    aiohttp_client: Any, settings: Settings, clock: FakeClock, tmp_path: Path
) -> None:
    """#7: ten token names at the per-token cap filled the global 10,000 and locked every
    other tenant out. By default there is no global cap (0); scaled down: ten tokens at
    their cap of 2 leave an eleventh free to open."""
    assert settings.vault.max_upload_sessions == 0
    config = tmp_path / "ckpt.toml"
    config.write_text("[uploads]\nmax_sessions = 0\n")
    assert load_settings(config, environ={}).vault.max_upload_sessions == 0
    admin = await started(
        aiohttp_client, settings, clock, vault={"max_upload_sessions_per_token": 2}
    )
    for i in range(10):
        flood = await admin.token_for("write:f/*", name=f"flood{i}")
        for _ in range(2):
            await admin.json("POST", "/v1/namespaces/f/x/uploads", 201, token=flood, json={})
        await admin.call("POST", "/v1/namespaces/f/x/uploads", token=flood, json={}, expect=429)
    other = await admin.token_for("write:o/*", name="other")
    await admin.json("POST", "/v1/namespaces/o/x/uploads", 201, token=other, json={})


async def test_one_token_reads_back_in_one_commit_at_once(
    aiohttp_client: Any, settings: Settings, clock: FakeClock
) -> None:
    """Four commits at the read-back limit held all four workers (another tenant's listing
    waited 3.4 s): a token's second concurrent read-back is 429 with Retry-After at once,
    changing nothing; another token's, and the same commit once the slot is free, go on.
    The first commit's hashing is held open here by taking its slot directly. Read-backs
    up to READ_BACK_FREE (256 MiB) take no slot: small concurrent commits never see 429."""
    admin = await started(aiohttp_client, settings, clock)
    w = await admin.token_for("read:rb/*", "write:rb/*", name="w")
    up = await admin.json("POST", "/v1/namespaces/rb/x/uploads", 201, token=w, json={})
    data = os.urandom(MIB)
    cid = hexhash(data)
    path = f"/v1/uploads/{up['upload_id']}"
    await admin.call("PUT", f"{path}/chunks/{cid}", token=w, data=data, expect=201)
    # 300 MiB not hashed on arrival: past READ_BACK_FREE, so it needs a read-back slot
    files = {"f": {"size": 300 * MIB, "chunks": [cid] * 300}}
    committer = admin.client.app[VAULT].committer
    with committer._read_back_slot("w", True):
        resp = await admin.call("POST", f"{path}/commit", token=w, json={"files": files})
        assert resp.status == 429
        assert resp.headers["Retry-After"]
        assert "uploads.max_read_backs_per_token" in (await resp.json())["error"]["message"]
        await nothing_stored(admin)
        other, other_cid, _ = await stored_chunk(admin, "rb/admin", MIB)
        mine = {"f": {"size": 300 * MIB, "chunks": [other_cid] * 300}}
        await admin.json("POST", f"/v1/uploads/{other}/commit", 201, json={"files": mine})
    rec = await admin.json("POST", f"{path}/commit", 201, token=w, json={"files": files})
    assert rec["namespace"] == "rb/x"


async def test_small_read_backs_of_one_token_go_on_at_once(
    aiohttp_client: Any, settings: Settings, clock: FakeClock
) -> None:
    """A read-back under READ_BACK_FREE needs no slot: with the token's slot taken, a
    commit of a small unproven file is still 201."""
    admin = await started(aiohttp_client, settings, clock)
    w = await admin.token_for("read:rb/*", "write:rb/*", name="w")
    up = await admin.json("POST", "/v1/namespaces/rb/y/uploads", 201, token=w, json={})
    data = os.urandom(64 << 10)
    cid = hexhash(data)
    path = f"/v1/uploads/{up['upload_id']}"
    await admin.call("PUT", f"{path}/chunks/{cid}", token=w, data=data, expect=201)
    files = {"f": {"size": 2 * len(data), "chunks": [cid, cid]}}
    with admin.client.app[VAULT].committer._read_back_slot("w", True):
        await admin.json("POST", f"{path}/commit", 201, token=w, json={"files": files})
