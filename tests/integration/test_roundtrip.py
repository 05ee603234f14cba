"""Round trips through the real service on loopback: sizes, ranges, dedup, inherit, lineage."""

from __future__ import annotations

import os
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpoint_vault.vault.chunking import LARGE

from ..conftest import Api, hexhash

BOUNDARY_SIZES = [
    0,
    1,
    LARGE.min_size - 1,
    LARGE.min_size,
    LARGE.min_size + 1,
    LARGE.max_size - 1,
    LARGE.max_size,
    LARGE.max_size + 1,
    3 * LARGE.max_size + 7,
]


async def test_sizes_around_chunk_boundaries_round_trip(api: Api) -> None:
    rng = random.Random(3)
    files = {f"f{n}.bin": rng.randbytes(n) for n in BOUNDARY_SIZES}
    rec = await api.save("sizes", files)
    assert rec["size"] == sum(BOUNDARY_SIZES)
    for name, data in files.items():
        assert await api.read("sizes", rec["id"], name) == data
        assert rec["files"][name] == {"size": len(data), "hash": hexhash(data)}


async def test_random_sizes_round_trip(api: Api) -> None:
    @settings(
        max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(size=st.integers(0, 700_000), seed=st.integers(0, 1000))
    def noop(size: int, seed: int) -> None:
        cases.append((size, seed))

    cases: list[tuple[int, int]] = []
    noop()
    for size, seed in cases:
        data = random.Random(seed).randbytes(size)
        rec = await api.save("hyp", {"x": data})
        assert await api.read("hyp", rec["id"], "x") == data


async def test_range_reads_and_etag(api: Api) -> None:
    data = os.urandom(700_000)
    rec = await api.save("rng", {"w": data})
    path = f"/v1/namespaces/rng/checkpoints/{rec['id']}/files/w"
    for first, last in [(0, 0), (10, 99), (65_530, 200_000), (699_000, 699_999)]:
        resp = await api.call("GET", path, headers={"Range": f"bytes={first}-{last}"}, expect=206)
        assert resp.headers["Content-Range"] == f"bytes {first}-{last}/700000"
        assert await resp.read() == data[first : last + 1]
    resp = await api.call("GET", path, headers={"Range": "bytes=-10"}, expect=206)
    assert await resp.read() == data[-10:]
    resp = await api.call("GET", path, headers={"Range": "bytes=699990-"}, expect=206)
    assert await resp.read() == data[699_990:]
    resp = await api.call("GET", path, expect=200)
    assert resp.headers["ETag"] == f'"{hexhash(data)}"'
    await api.call("GET", path, headers={"If-None-Match": resp.headers["ETag"]}, expect=304)
    err = await api.json("GET", path, expect=416, headers={"Range": "bytes=800000-"})
    assert err["error"]["code"] == "invalid_range"


async def test_one_changed_mebibyte_stores_few_new_chunks(api: Api) -> None:
    data = bytearray(random.Random(11).randbytes(64 << 20))
    await api.save("dedup", {"model.bin": bytes(data)})
    before = await api.json("GET", "/v1/stats")
    data[30 << 20 : 31 << 20] = os.urandom(1 << 20)
    rec = await api.save("dedup", {"model.bin": bytes(data)}, parent="latest")
    after = await api.json("GET", "/v1/stats")
    new_chunks = after["chunks"] - before["chunks"]
    assert new_chunks <= (1 << 20) // LARGE.min_size + 4, new_chunks
    assert after["stored_bytes"] - before["stored_bytes"] < 1.6 * (1 << 20)
    assert after["logical_bytes"] == 2 * (64 << 20)
    assert await api.read("dedup", rec["id"], "model.bin") == bytes(data)


async def test_client_chunked_upload_sends_only_missing(api: Api) -> None:
    pieces = [os.urandom(5000) for _ in range(4)]
    ids = [hexhash(p) for p in pieces]
    up = await api.open("cc")
    uid = up["upload_id"]
    missing = await api.json("POST", f"/v1/uploads/{uid}/missing", json={"chunks": ids})
    assert missing == {"missing": ids}
    for cid, piece in zip(ids, pieces, strict=True):
        await api.call("PUT", f"/v1/uploads/{uid}/chunks/{cid}", data=piece, expect=201)
    await api.call("PUT", f"/v1/uploads/{uid}/chunks/{ids[0]}", data=pieces[0], expect=200)
    whole = b"".join(pieces)
    listing = {"w": {"size": len(whole), "hash": hexhash(whole), "chunks": ids}}
    rec = await api.json("POST", f"/v1/uploads/{uid}/commit", expect=201, json={"files": listing})
    again = await api.json("POST", f"/v1/uploads/{uid}/commit", expect=200, json={"files": listing})
    assert again == rec
    up2 = await api.open("cc", parent="latest")
    missing2 = await api.json(
        "POST", f"/v1/uploads/{up2['upload_id']}/missing", json={"chunks": [*ids, "f" * 64]}
    )
    assert missing2 == {"missing": ["f" * 64]}
    manifest = await api.json("GET", f"/v1/namespaces/cc/checkpoints/{rec['id']}/manifest")
    chunks = manifest["files"]["w"]["chunks"]
    assert [c["id"] for c in chunks] == ids
    assert [c["offset"] for c in chunks] == [
        0,
        5000,
        10000,
        15000,
    ]
    assert await api.read("cc", "latest", "w") == whole


async def test_inherit_lineage_validity_and_fork(api: Api) -> None:
    a = await api.save("life", {"model": b"m" * 1000, "opt": b"o" * 1000}, metadata={"step": 1})
    b = await api.save("life", {"opt": b"p" * 1000}, parent="latest", inherit=True)
    c = await api.save("life", {"opt": b"q" * 1000}, parent="latest", inherit=True)
    assert sorted(c["files"]) == ["model", "opt"]
    assert c["parent"] == b["id"]
    assert await api.read("life", c["id"], "model") == b"m" * 1000
    await api.json(
        "PATCH",
        f"/v1/namespaces/life/checkpoints/{c['id']}",
        json={"validity": {"state": "invalid", "reason": "NaN loss"}},
    )
    latest_valid = await api.json("GET", "/v1/namespaces/life/checkpoints/latest-valid")
    assert latest_valid["id"] == b["id"]
    await api.call("DELETE", f"/v1/namespaces/life/checkpoints/{b['id']}", expect=204)
    chain = (await api.json("GET", f"/v1/namespaces/life/checkpoints/{c['id']}/lineage"))["chain"]
    assert [r["id"] for r in chain] == [c["id"], b["id"], a["id"]]
    assert chain[1]["deleted"] is True
    assert chain[0]["validity"]["state"] == "invalid"
    fork = await api.json(
        "POST",
        f"/v1/namespaces/life/checkpoints/{a['id']}/fork",
        expect=201,
        json={"namespace": "life/branch", "tags": ["exp"]},
    )
    assert fork["parent"] == a["id"]
    assert fork["namespace"] == "life/branch"
    assert await api.read("life/branch", "latest", "model") == b"m" * 1000
    listed = await api.json("GET", "/v1/namespaces/life/checkpoints?validity=invalid")
    assert [r["id"] for r in listed["checkpoints"]] == [c["id"]]
    names = {n["name"] for n in (await api.json("GET", "/v1/namespaces"))["namespaces"]}
    assert names == {"life", "life/branch"}
    check = await api.json("POST", "/v1/admin/check")
    assert check["ok"] is True


async def test_openapi_lists_every_route(api: Api) -> None:
    doc = await api.json("GET", "/v1/openapi.json")
    assert doc["openapi"].startswith("3.")
    for path in [
        "/v1/namespaces/{ns}/uploads",
        "/v1/uploads/{upload_id}/missing",
        "/v1/uploads/{upload_id}/files/{name}",
        "/v1/namespaces/{ns}/checkpoints/{ref}",
        "/v1/admin/tokens",
        "/v1/health",
    ]:
        assert path in doc["paths"], path
    assert "put" in doc["paths"]["/v1/uploads/{upload_id}/chunks/{chunk_id}"]
