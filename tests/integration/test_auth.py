"""Tokens and scopes: who may read, write, delete and administer what."""

from __future__ import annotations

import os
import stat

from ..conftest import Api, hexhash


async def test_admin_token_file_is_private(api: Api) -> None:
    path = api.data_dir / "admin.token"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert api.token.startswith("ckpt_")


async def test_missing_or_unknown_token_is_401(api: Api) -> None:
    resp = await api.client.get("/v1/namespaces")
    assert resp.status == 401
    assert (await resp.json())["error"]["code"] == "unauthorized"
    for header in ["Bearer nope", "Bearer ckpt_0000_xxxx", "Basic abc", api.token]:
        resp = await api.client.get("/v1/namespaces", headers={"Authorization": header})
        assert resp.status == 401, header
    tampered = api.token[:-2] + ("AA" if not api.token.endswith("AA") else "BB")
    assert (await api.call("GET", "/v1/namespaces", token=tampered)).status == 401
    assert (await api.client.get("/v1/health")).status == 200


async def test_scopes_limit_namespaces_and_actions(api: Api) -> None:
    await api.save("team/a", {"f": b"a"})
    await api.save("other", {"f": b"o"})
    producer = await api.token_for("read:team/*", "write:team/*", name="producer")
    reader = await api.token_for("read:team/*", name="reader")

    rec = await api.json(
        "POST", "/v1/namespaces/team/b/uploads", expect=201, token=producer, json={}
    )
    commit = await api.call(
        "POST", f"/v1/uploads/{rec['upload_id']}/commit", token=producer, json={}, expect=201
    )
    cid = (await commit.json())["id"]
    await api.call("POST", "/v1/namespaces/other/uploads", token=producer, json={}, expect=403)
    await api.call("GET", "/v1/namespaces/other/checkpoints", token=producer, expect=403)
    await api.call(
        "GET", "/v1/namespaces/team/a/checkpoints/latest/files/f", token=producer, expect=200
    )
    # write is append-only: no delete, no unpin, no admin
    await api.call("DELETE", f"/v1/namespaces/team/b/checkpoints/{cid}", token=producer, expect=403)
    await api.call(
        "PATCH",
        f"/v1/namespaces/team/b/checkpoints/{cid}",
        token=producer,
        json={"pinned": True},
        expect=200,
    )
    await api.call(
        "PATCH",
        f"/v1/namespaces/team/b/checkpoints/{cid}",
        token=producer,
        json={"pinned": False},
        expect=403,
    )
    await api.call("POST", "/v1/admin/gc", token=producer, expect=403)
    await api.call("GET", "/v1/stats", token=producer, expect=403)
    # read-only token cannot upload, mark or fork into a namespace
    await api.call("POST", "/v1/namespaces/team/a/uploads", token=reader, json={}, expect=403)
    await api.call(
        "PATCH",
        f"/v1/namespaces/team/b/checkpoints/{cid}",
        token=reader,
        json={"validity": {"state": "valid"}},
        expect=403,
    )
    await api.call(
        "POST",
        f"/v1/namespaces/team/b/checkpoints/{cid}/fork",
        token=reader,
        json={"namespace": "team/c"},
        expect=403,
    )
    names = {
        n["name"] for n in (await api.json("GET", "/v1/namespaces", token=reader))["namespaces"]
    }
    assert names == {"team/a", "team/b"}
    # upload routes check the session's namespace, not just the token
    other_up = await api.open("other")
    await api.call(
        "PUT",
        f"/v1/uploads/{other_up['upload_id']}/chunks/{hexhash(b'z')}",
        token=producer,
        data=b"z",
        expect=403,
    )


async def test_token_lifecycle(api: Api) -> None:
    token = await api.token_for("read:*", name="temp")
    await api.call("GET", "/v1/namespaces", token=token, expect=200)
    listing = await api.json("GET", "/v1/admin/tokens")
    assert {"admin", "temp"} <= {t["name"] for t in listing["tokens"]}
    assert all("token" not in t and "secret_hash" not in t for t in listing["tokens"])
    dup = await api.call("POST", "/v1/admin/tokens", json={"name": "temp", "scopes": ["read:*"]})
    assert dup.status == 409
    bad = await api.call("POST", "/v1/admin/tokens", json={"name": "x", "scopes": ["root"]})
    assert bad.status == 400
    await api.call("DELETE", "/v1/admin/tokens/temp", expect=204)
    await api.call("GET", "/v1/namespaces", token=token, expect=401)
    await api.call("DELETE", "/v1/admin/tokens/temp", expect=404)
