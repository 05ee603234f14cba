"""The batch chunk upload and the one-request save."""

from __future__ import annotations

import os

import blake3

from checkpoint_vault.protocol import (
    BUNDLE_TYPE,
    CHUNK_BATCH_TYPE,
    encode_bundle,
    encode_chunk_batch,
)

from ..conftest import Api, hexhash


def raw_id(data: bytes) -> bytes:
    return blake3.blake3(data).digest()


async def test_batch_upload_then_commit(api: Api) -> None:
    pieces = [os.urandom(3000 + i) for i in range(20)]
    up = await api.open("batch")
    body = b"".join(encode_chunk_batch([(raw_id(p), p) for p in pieces]))
    path = f"/v1/uploads/{up['upload_id']}/chunks"
    headers = {"Content-Type": CHUNK_BATCH_TYPE}
    out = await api.json("POST", path, data=body, headers=headers)
    assert out == {"chunks": 20, "created": 20}
    assert (await api.json("POST", path, data=body, headers=headers))["created"] == 0
    whole = b"".join(pieces)
    listing = {
        "f": {"size": len(whole), "hash": hexhash(whole), "chunks": [hexhash(p) for p in pieces]}
    }
    rec = await api.json(
        "POST", f"/v1/uploads/{up['upload_id']}/commit", expect=201, json={"files": listing}
    )
    assert await api.read("batch", rec["id"], "f") == whole


async def test_batch_with_one_bad_chunk_stores_nothing(api: Api) -> None:
    good, bad = os.urandom(1000), os.urandom(1000)
    up = await api.open("batch")
    before = (await api.json("GET", "/v1/stats"))["chunks"]
    body = b"".join(encode_chunk_batch([(raw_id(good), good), (raw_id(good), bad)]))
    err = await api.json("POST", f"/v1/uploads/{up['upload_id']}/chunks", expect=400, data=body)
    assert err["error"]["code"] == "hash_mismatch"
    err = await api.json(
        "POST", f"/v1/uploads/{up['upload_id']}/chunks", expect=400, data=body[:-10]
    )
    assert err["error"]["code"] == "invalid_request"
    assert (await api.json("GET", "/v1/stats"))["chunks"] == before


async def test_one_request_save_is_idempotent_and_dedups(api: Api) -> None:
    state = b'{"messages": [' + b'{"role": "user", "content": "hello"},' * 400 + b"{}]}"
    header = {"chunking": "small", "metadata": {"step": 1}, "key": "k" * 20}
    body = encode_bundle(header, [("state.json", state), ("empty", b"")])
    path = "/v1/namespaces/agent/checkpoints"
    headers = {"Content-Type": BUNDLE_TYPE}
    first = await api.json("POST", path, expect=201, data=body, headers=headers)
    again = await api.json("POST", path, expect=200, data=body, headers=headers)
    assert again == first
    assert first["files"]["state.json"] == {"size": len(state), "hash": hexhash(state)}
    assert await api.read("agent", first["id"], "state.json") == state
    assert await api.read("agent", first["id"], "empty") == b""
    ns = (await api.json("GET", "/v1/namespaces"))["namespaces"][0]
    assert ns["chunking"]["profile"] == "small"
    stored = (await api.json("GET", "/v1/stats"))["stored_bytes"]
    grown = state[:-3] + b', {"role": "assistant", "content": "hi"}]}'
    second = await api.json(
        "POST",
        path,
        expect=201,
        headers=headers,
        data=encode_bundle({"parent": "latest", "inherit": True}, [("state.json", grown)]),
    )
    assert second["parent"] == first["id"]
    assert sorted(second["files"]) == ["empty", "state.json"]
    assert (await api.json("GET", "/v1/stats"))["stored_bytes"] - stored < 4096


async def test_bad_bundles_change_nothing(api: Api) -> None:
    before = await api.json("GET", "/v1/stats")
    path = "/v1/namespaces/agent/checkpoints"
    for body in [
        b"",
        b"XXXX\x00\x00\x00\x00",
        encode_bundle({}, [("a", b"x")])[:-1],
        encode_bundle({}, [("../a", b"x")]),
        encode_bundle({"key": "short"}, []),
    ]:
        resp = await api.call("POST", path, data=body)
        assert resp.status == 400, await resp.text()
        assert (await resp.json())["error"]["code"] in ("invalid_request", "invalid_name")
    assert await api.json("GET", "/v1/stats") == before
