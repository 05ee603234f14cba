"""Concurrent producers, and GC racing uploads and commits."""

from __future__ import annotations

import asyncio
import os
import random

from checkpoint_vault.api import Settings
from checkpoint_vault.vault import FakeClock

from ..conftest import Api, hexhash


async def test_concurrent_uploads_to_one_namespace(api: Api) -> None:
    shared = os.urandom(400_000)
    payloads = {i: shared + os.urandom(50_000 + i) for i in range(12)}
    records = await asyncio.gather(
        *(api.save("busy", {"f": data}, metadata={"i": i}) for i, data in payloads.items())
    )
    assert len({r["id"] for r in records}) == 12
    listing = await api.json("GET", "/v1/namespaces/busy/checkpoints?limit=100")
    assert sorted(r["id"] for r in listing["checkpoints"]) == sorted(r["id"] for r in records)
    ids = [r["id"] for r in listing["checkpoints"]]
    assert ids == sorted(ids, reverse=True)
    for rec in records:
        assert await api.read("busy", rec["id"], "f") == payloads[rec["metadata"]["i"]]
    assert (await api.json("POST", "/v1/admin/check"))["ok"]


async def test_gc_racing_uploads_never_loses_committed_chunks(api: Api) -> None:
    """GC runs back to back while producers upload, commit and delete: reference counts
    must keep every committed checkpoint whole (gc_grace is 0 in these tests)."""
    rng = random.Random(5)
    base = rng.randbytes(300_000)
    committed: dict[str, bytes] = {}

    async def producer(n: int) -> None:
        for step in range(6):
            data = base[: rng.randrange(1, 300_000)] + rng.randbytes(rng.randrange(0, 20_000))
            if step % 2:  # client-chunked, with a missing query before the commit
                up = await api.open("race")
                pieces = [data[i : i + 7000] for i in range(0, len(data), 7000)]
                ids = [hexhash(p) for p in pieces]
                missing = set(
                    (
                        await api.json(
                            "POST", f"/v1/uploads/{up['upload_id']}/missing", json={"chunks": ids}
                        )
                    )["missing"]
                )
                for cid, piece in zip(ids, pieces, strict=True):
                    if cid in missing:
                        await api.call(
                            "PUT", f"/v1/uploads/{up['upload_id']}/chunks/{cid}", data=piece
                        )
                await asyncio.sleep(0)  # let a GC run between the query and the commit
                rec = await api.json(
                    "POST",
                    f"/v1/uploads/{up['upload_id']}/commit",
                    expect=201,
                    json={
                        "files": {"f": {"size": len(data), "hash": hexhash(data), "chunks": ids}}
                    },
                )
            else:
                rec = await api.save("race", {"f": data})
            committed[rec["id"]] = data
            if step == 3:  # deletions make chunks collectable while others still use them
                victim = next(iter(committed))
                committed.pop(victim)
                await api.call("DELETE", f"/v1/namespaces/race/checkpoints/{victim}", expect=204)

    async def collector() -> int:
        runs = 0
        while not done.is_set():
            await api.json("POST", "/v1/admin/gc")
            runs += 1
            await asyncio.sleep(0)
        return runs

    done = asyncio.Event()
    gc_task = asyncio.ensure_future(collector())
    await asyncio.gather(*(producer(i) for i in range(4)))
    done.set()
    assert await gc_task > 0
    await api.json("POST", "/v1/admin/gc")
    for cid, data in committed.items():
        assert await api.read("race", cid, "f") == data
    check = await api.json("POST", "/v1/admin/check")
    assert check["ok"], check


async def test_missing_query_reservation_outlives_a_delete_and_gc(
    api: Api, clock: FakeClock, settings: Settings
) -> None:
    data = os.urandom(200_000)
    old = await api.save("res", {"f": data})
    clock.advance(settings.vault.upload_ttl + 1)  # the first upload's reservations lapse
    manifest = await api.json("GET", f"/v1/namespaces/res/checkpoints/{old['id']}/manifest")
    ids = [c["id"] for c in manifest["files"]["f"]["chunks"]]
    reserved = await api.open("res")
    found = await api.json(
        "POST", f"/v1/uploads/{reserved['upload_id']}/missing", json={"chunks": ids}
    )
    assert found["missing"] == []
    await api.call("DELETE", f"/v1/namespaces/res/checkpoints/{old['id']}", expect=204)
    clock.advance(1)
    listing = {"f": {"size": len(data), "hash": hexhash(data), "chunks": ids}}
    assert (await api.json("POST", "/v1/admin/gc"))["chunks_deleted"] == 0
    rec = await api.json(
        "POST", f"/v1/uploads/{reserved['upload_id']}/commit", expect=201, json={"files": listing}
    )
    assert await api.read("res", rec["id"], "f") == data
    # Control: once nothing references or reserves them, the same chunks do go.
    await api.call("DELETE", f"/v1/namespaces/res/checkpoints/{rec['id']}", expect=204)
    clock.advance(settings.vault.upload_ttl + 1)
    assert (await api.json("POST", "/v1/admin/gc"))["chunks_deleted"] == len(set(ids))
    late = await api.open("res")
    err = await api.json(
        "POST", f"/v1/uploads/{late['upload_id']}/commit", expect=409, json={"files": listing}
    )
    assert sorted(err["error"]["missing"]) == sorted(set(ids))
