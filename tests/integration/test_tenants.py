"""Tenant isolation, probed as a tenant would (issue 16): dedup domains and lineage.

Tokens as in the issue: `a-rw` reads and writes `ns-a/*`, `a-w` only writes it, `b-rw`
reads, writes and deletes `ns-b/*`. Each test replays an attack from the issue against the
real service on loopback and checks it now fails.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass
from typing import Any

from checkpoint_vault.api import Settings, create_app
from checkpoint_vault.vault import FakeClock

from ..conftest import Api, hexhash

SECRET = b"DB_PASSWORD=4711\nPIN=%04d\n"
PIN = 4711


@dataclass
class Tenants:
    a_rw: str
    a_w: str
    b_rw: str


async def tenants(api: Api) -> Tenants:
    return Tenants(
        a_rw=await api.token_for("read:ns-a/*", "write:ns-a/*", name="a-rw"),
        a_w=await api.token_for("write:ns-a/*", name="a-w"),
        b_rw=await api.token_for("read:ns-b/*", "write:ns-b/*", "delete:ns-b/*", name="b-rw"),
    )


async def b_saves_secret(api: Api, t: Tenants) -> str:
    """Tenant B stores a one-chunk config file (file hash = chunk id); returns the id."""
    up = await api.json("POST", "/v1/namespaces/ns-b/app/uploads", 201, token=t.b_rw, json={})
    data = SECRET % PIN
    await api.json(
        "PUT", f"/v1/uploads/{up['upload_id']}/files/config.env", 201, token=t.b_rw, data=data
    )
    rec = await api.json(
        "POST", f"/v1/uploads/{up['upload_id']}/commit", 201, token=t.b_rw, json={}
    )
    return str(rec["id"])


async def test_guessed_small_file_is_neither_confirmed_nor_readable(api: Api) -> None:
    """#1: 10,000 guesses in one `missing` query, then a commit of the id never sent."""
    t = await tenants(api)
    await b_saves_secret(api, t)
    guesses = [hexhash(SECRET % pin) for pin in range(10_000)]
    right = hexhash(SECRET % PIN)
    up = await api.json("POST", "/v1/namespaces/ns-a/x/uploads", 201, token=t.a_w, json={})
    uid = up["upload_id"]
    out = await api.json(
        "POST", f"/v1/uploads/{uid}/missing", token=t.a_w, json={"chunks": guesses}
    )
    assert len(out["missing"]) == 10_000  # nothing confirmed
    for size in (len(SECRET % PIN), 17):  # right size or wrong: the same answer, no sizes
        resp = await api.call(
            "POST",
            f"/v1/uploads/{uid}/commit",
            token=t.a_w,
            expect=409,
            json={"files": {"c.env": {"size": size, "hash": right, "chunks": [right]}}},
        )
        err = (await resp.json())["error"]
        assert err["code"] == "missing_chunks"
        assert str(len(SECRET % PIN)) not in err["message"]
    # sending guessed bytes confirms nothing either: every PUT answers "created"
    for pin in (PIN, 1234):
        data = SECRET % pin
        resp = await api.call(
            "PUT", f"/v1/uploads/{uid}/chunks/{hexhash(data)}", token=t.a_w, data=data, expect=201
        )
        assert (await resp.json())["created"] is True
    batch = b"".join(
        bytes.fromhex(hexhash(SECRET % p)) + struct.pack("<I", len(SECRET % p)) + SECRET % p
        for p in (PIN, 42)
    )
    up = await api.json("POST", "/v1/namespaces/ns-a/y/uploads", 201, token=t.a_w, json={})
    out = await api.json("POST", f"/v1/uploads/{up['upload_id']}/chunks", token=t.a_w, data=batch)
    assert out == {"chunks": 2, "created": 2}
    # and A's reader sees no B file in ns-a
    listing = await api.json("GET", "/v1/namespaces/ns-a/x/checkpoints", token=t.a_rw)
    assert listing["checkpoints"] == []


async def test_dedup_still_works_inside_the_domain(api: Api) -> None:
    """A write-only producer keeps incremental saves across its own namespaces; once it has
    sent the bytes itself, its session may commit them."""
    t = await tenants(api)
    await b_saves_secret(api, t)
    data = b"weights " * 3000
    await api.save("ns-a/run1", {"w.bin": data})  # admin saves into A's space
    up = await api.json("POST", "/v1/namespaces/ns-a/run2/uploads", 201, token=t.a_w, json={})
    uid = up["upload_id"]
    manifest = await api.json("GET", "/v1/namespaces/ns-a/run1/checkpoints/latest/manifest")
    ids = [c["id"] for c in manifest["files"]["w.bin"]["chunks"]]
    right = hexhash(SECRET % PIN)
    out = await api.json(
        "POST", f"/v1/uploads/{uid}/missing", token=t.a_w, json={"chunks": [*ids, right]}
    )
    assert out["missing"] == [right]
    secret = SECRET % PIN
    await api.call("PUT", f"/v1/uploads/{uid}/chunks/{right}", token=t.a_w, data=secret, expect=201)
    out = await api.json(
        "POST", f"/v1/uploads/{uid}/missing", token=t.a_w, json={"chunks": [right]}
    )
    assert out["missing"] == []  # sent by this session
    files = {
        "w.bin": {"size": len(data), "hash": hexhash(data), "chunks": ids},
        "c.env": {"size": len(secret), "hash": right, "chunks": [right]},
    }
    rec = await api.json(
        "POST", f"/v1/uploads/{uid}/commit", 201, token=t.a_w, json={"files": files}
    )
    assert rec["id"]
    stats = await api.json("GET", "/v1/stats")
    assert stats["chunks"] == len(set(ids)) + 1  # B's secret stored once all the same


async def test_query_cannot_keep_deleted_data_alive(api: Api, clock: FakeClock) -> None:
    """#1b: A's `missing` query used to reserve B's chunk for A's session (6 h), so GC kept
    it and A read it after B deleted it. Now the file is gone after GC."""
    t = await tenants(api)
    cid = await b_saves_secret(api, t)
    clock.advance(3 * 3600)  # B's own upload reservation lapses before A's session would
    right = hexhash(SECRET % PIN)
    up = await api.json("POST", "/v1/namespaces/ns-a/x/uploads", 201, token=t.a_w, json={})
    await api.json(
        "POST", f"/v1/uploads/{up['upload_id']}/missing", token=t.a_w, json={"chunks": [right]}
    )
    await api.call("DELETE", f"/v1/namespaces/ns-b/app/checkpoints/{cid}", token=t.b_rw, expect=204)
    clock.advance(3 * 3600 + 1)  # B's session expired; A's is still open
    gc = await api.json("POST", "/v1/admin/gc?dry_run=false")
    assert gc["chunks_deleted"] >= 1
    up2 = await api.open("ns-b/app")  # admin: every namespace is in its domain
    out = await api.json(
        "POST", f"/v1/uploads/{up2['upload_id']}/missing", json={"chunks": [right]}
    )
    assert out["missing"] == [right]  # gone from the vault
    resp = await api.call(
        "POST",
        f"/v1/uploads/{up['upload_id']}/commit",
        token=t.a_w,
        json={"files": {"c": {"size": 26, "hash": right, "chunks": [right]}}},
    )
    assert resp.status == 409


async def test_lineage_stops_at_the_namespace_boundary(api: Api) -> None:
    """#2: a fork's source namespace no longer shows through the target's lineage."""
    t = await tenants(api)
    src = await b_saves_secret(api, t)
    fork = await api.json(
        "POST", f"/v1/namespaces/ns-b/app/checkpoints/{src}/fork", 201,
        json={"namespace": "ns-a/forked"},
    )  # fmt: skip
    chain = (await api.json("GET", f"/v1/namespaces/ns-a/forked/checkpoints/{fork['id']}/lineage",
                            token=t.a_rw))["chain"]  # fmt: skip
    assert [r["id"] for r in chain] == [fork["id"]]
    assert chain[0]["parent"] == src  # an opaque reference: its record stays out of reach
    await api.call("GET", f"/v1/namespaces/ns-b/app/checkpoints/{src}", token=t.a_rw, expect=403)
    full = await api.json("GET", f"/v1/namespaces/ns-a/forked/checkpoints/{fork['id']}/lineage")
    assert [r["id"] for r in full["chain"]] == [fork["id"], src]  # admin sees it all


async def commit_as(api: Api, token: str, ns: str, **body: object) -> dict[str, object]:
    up = await api.json("POST", f"/v1/namespaces/{ns}/uploads", 201, token=token, json=body)
    out: dict[str, object] = await api.json(
        "POST", f"/v1/uploads/{up['upload_id']}/commit", 201, token=token, json={}
    )
    return out


async def test_write_only_tokens_are_append_only(api: Api) -> None:
    """#3: a write token could strip `release` so retention deleted it, or mark others'
    checkpoints invalid; #9: and PATCH/commit answered what GET refuses."""
    t = await tenants(api)
    release = await api.save("ns-a/run", {"f": b"v1"}, tags=["release"])
    base = f"/v1/namespaces/ns-a/run/checkpoints/{release['id']}"
    for body in ({"tags": []}, {"tags": ["release", "x"]}, {"validity": {"state": "invalid"}}):
        resp = await api.call("PATCH", base, token=t.a_w, json=body, expect=403)
        assert (await resp.json())["error"]["code"] == "forbidden"
    await api.json("PUT", "/v1/namespaces/ns-a/run/policy",
                   json={"retention": {"keep_last": 1, "keep_tags": ["release"]}})  # fmt: skip
    mine = await commit_as(api, t.a_w, "ns-a/run", parent="latest", inherit=True,
                           metadata={"step": 2})  # fmt: skip
    assert mine == {"id": mine["id"], "namespace": "ns-a/run"}  # no parent files, metadata
    own = f"/v1/namespaces/ns-a/run/checkpoints/{mine['id']}"
    out = await api.json("PATCH", own, token=t.a_w, json={"tags": ["candidate"]})
    assert out == {"id": mine["id"], "namespace": "ns-a/run"}
    await api.json("PATCH", own, token=t.a_w, json={"validity": {"state": "invalid"}})
    await api.call("PATCH", own, token=t.a_w, json={"tags": []}, expect=403)
    plan = await api.json("POST", "/v1/admin/retention?dry_run=true&namespace=ns-a/run")
    assert release["id"] in plan["keep"]
    rec = await api.json("GET", own, token=t.a_rw)
    assert (rec["tags"], rec["validity"]["state"]) == (["candidate"], "invalid")
    assert "step" in rec["metadata"]  # a reader still gets the whole record
    # a token with delete may do all of it
    d = await api.token_for("read:ns-a/*", "write:ns-a/*", "delete:ns-a/*", name="a-del")
    await api.json("PATCH", base, token=d, json={"tags": []})


async def test_the_pending_bytes_limit_is_no_oracle(
    aiohttp_client: Any, settings: Settings, clock: FakeClock
) -> None:
    """Bytes are charged against a token's uncommitted-upload limit whether or not another
    tenant stored them: else filling the limit to just below and sending a guess would
    tell, by 507 or not, whether the guess is stored elsewhere."""
    secret = SECRET % PIN
    vault = dataclasses.replace(settings.vault, max_pending_bytes_per_token=len(secret) + 10)
    client = await aiohttp_client(create_app(dataclasses.replace(settings, vault=vault), clock))
    api = Api(client, (settings.data_dir / "admin.token").read_text().strip(), settings.data_dir)
    t = await tenants(api)
    await b_saves_secret(api, t)
    for guess in (secret, SECRET % 1234):  # stored elsewhere, or not: the same answers
        up = await api.json("POST", "/v1/namespaces/ns-a/x/uploads", 201, token=t.a_w, json={})
        path = f"/v1/uploads/{up['upload_id']}"
        await api.call(
            "PUT", f"{path}/chunks/{hexhash(guess)}", token=t.a_w, data=guess, expect=201
        )
        await api.call("PUT", f"{path}/files/more", token=t.a_w, data=b"x" * 20, expect=507)
        await api.call("DELETE", path, token=t.a_w, expect=204)
