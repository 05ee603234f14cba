"""Tiering through the service against a real SeaweedFS: old checkpoints move to packs in
the object store and still stream back; an outage answers 503 with Retry-After."""

from __future__ import annotations

import random
import secrets
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from checkpoint_vault.api import Settings, create_app
from checkpoint_vault.api.transfer.promotion import PROMOTIONS
from checkpoint_vault.tiering import open_tier
from checkpoint_vault.vault import FakeClock, VaultConfig
from checkpoint_vault.vault.seal import add_key

from ..conftest import Api
from ..seaweed import SeaweedFS


def tier_settings(tmp_path: Path, seaweed: SeaweedFS) -> Settings:
    url = f"s3://vault/{secrets.token_hex(4)}"
    return Settings(
        data_dir=tmp_path / "data",
        vault=VaultConfig(map_size=4 << 20, gc_grace=0.0),
        tiers={"cold": {"url": url, **seaweed.options()}},
    )


async def start(aiohttp_client: Any, settings: Settings, clock: FakeClock) -> Api:
    client = await aiohttp_client(create_app(settings, clock))
    token = (settings.data_dir / "admin.token").read_text().strip()
    return Api(client, token, settings.data_dir)


async def test_demote_to_seaweedfs_and_stream_back(
    aiohttp_client: Any, tmp_path: Path, seaweed: SeaweedFS, clock: FakeClock
) -> None:
    api = await start(aiohttp_client, tier_settings(tmp_path, seaweed), clock)
    rng = random.Random(6)
    files = [rng.randbytes(600_000) for _ in range(3)]
    ids = [(await api.save("tiered", {"w": data}))["id"] for data in files]
    clock.advance(3 * 86400)
    await api.json(
        "PUT",
        "/v1/namespaces/tiered/policy",
        json={"tiering": {"target": "cold", "demote_after": "1d", "keep_hot_last": 1}},
    )
    plan = await api.json("POST", "/v1/admin/tiering?dry_run=true")
    assert sorted(plan["tiers"]["cold"]["checkpoints"]) == sorted(ids[:2])
    done = await api.json("POST", "/v1/admin/tiering?dry_run=false")
    assert done["moved"]["cold"]["chunks"] > 0
    for cid, data in zip(ids, files, strict=True):
        rec = await api.json("GET", f"/v1/namespaces/tiered/checkpoints/{cid}")
        assert rec["tier"] == ("hot" if cid == ids[2] else "cold")
        assert await api.read("tiered", cid, "w") == data
        part = await api.read("tiered", cid, "w", headers={"Range": "bytes=1000-1999"})
        assert part == data[1000:2000]
    assert (await api.json("POST", "/v1/admin/check"))["ok"] is True
    assert (await api.json("POST", "/v1/admin/verify"))["corrupt"] == []


@pytest.mark.slow
async def test_cold_reads_during_an_outage_are_503_then_recover(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, seaweed: SeaweedFS
) -> None:
    own = seaweed  # killed and restarted here; two SeaweedFS at once do not start cleanly
    try:
        api = await start(aiohttp_client, tier_settings(tmp_path, own), clock)
        data = random.Random(7).randbytes(300_000)
        cid = (await api.save("out", {"w": data}))["id"]
        await api.save("out", {"w": b"newest stays hot"})
        clock.advance(2 * 86400)
        await api.json(
            "PUT",
            "/v1/namespaces/out/policy",
            json={"tiering": {"target": "cold", "demote_after": "1d"}},
        )
        moved = await api.json("POST", "/v1/admin/tiering?dry_run=false")
        assert moved["moved"]["cold"]["chunks"] > 0, moved
        own.kill()
        resp = await api.call("GET", f"/v1/namespaces/out/checkpoints/{cid}/files/w")
        assert resp.status == 503
        assert int(resp.headers["Retry-After"]) > 0
        assert (await resp.json())["error"]["code"] == "unavailable"
        assert await api.read("out", "latest", "w") == b"newest stays hot"  # hot still reads
        await api.save("out", {"w": b"writes still land hot"})
        own.start()
        assert await api.read("out", cid, "w") == data
    finally:
        if not own.running():
            own.start()


async def test_sealed_tier_promotion_on_read_and_repack_through_the_service(
    aiohttp_client: Any, tmp_path: Path, seaweed: SeaweedFS, clock: FakeClock
) -> None:
    keys = tmp_path / "keys"
    add_key(keys)
    settings = replace(tier_settings(tmp_path, seaweed), key_file=keys)
    api = await start(aiohttp_client, settings, clock)
    rng = random.Random(8)
    files = [b"plaintext-marker " * 100 + rng.randbytes(400_000) for _ in range(3)]
    ids = [(await api.save("sealed", {"w": data}))["id"] for data in files]
    clock.advance(3 * 86400)
    await api.json(
        "PUT",
        "/v1/namespaces/sealed/policy",
        json={"tiering": {"target": "cold", "demote_after": "1d", "keep_hot_last": 0}},
    )
    await api.json("POST", "/v1/admin/tiering?dry_run=false")
    cold = open_tier("cold", settings.tiers["cold"]["url"], seaweed.options())
    objects = {k: cold.get(k) for k in cold.list("")}
    assert objects
    assert not any(b"plaintext-marker" in body for body in objects.values())
    # a backup in the bucket is sealed too: it holds manifests and chunk ids
    backup = await api.json("POST", "/v1/admin/catalog/backup", expect=201, json={})
    assert backup["sealed"] is True
    assert cold.get(backup["key"])[:4] == b"CVE1"

    # promote_on_read: the read is served cold, the bytes come back hot behind it
    await api.json(
        "PUT", "/v1/namespaces/sealed/policy", json={"tiering": {"promote_on_read": True}}
    )
    assert await api.read("sealed", ids[0], "w") == files[0]
    await api.client.server.app[PROMOTIONS].drain()
    rec = await api.json("GET", f"/v1/namespaces/sealed/checkpoints/{ids[0]}")
    assert rec["tier"] == "hot"

    # delete one and collect it: the GC route repacks what is left (as the scheduled GC
    # does), so the next tiering run finds nothing more to repack
    await api.call("DELETE", f"/v1/namespaces/sealed/checkpoints/{ids[1]}")
    clock.advance(7 * 3600)
    collected = await api.json("POST", "/v1/admin/gc?dry_run=false")
    assert collected["packs_rewritten"] == 1
    assert collected["pack_bytes_freed"] > 0
    done = await api.json("POST", "/v1/admin/tiering?dry_run=false")
    assert done["repack"]["rewritten"] == 0
    assert await api.read("sealed", ids[2], "w") == files[2]
    assert (await api.json("POST", "/v1/admin/check"))["ok"] is True
    assert (await api.json("POST", "/v1/admin/verify"))["corrupt"] == []


async def test_warm_file_tier_then_cold_seaweedfs_through_the_service(
    aiohttp_client: Any, tmp_path: Path, seaweed: SeaweedFS, clock: FakeClock
) -> None:
    cold = tier_settings(tmp_path, seaweed).tiers["cold"]
    warm = {"url": f"file://{tmp_path / 'warm'}"}
    settings = replace(tier_settings(tmp_path, seaweed), tiers={"warm": warm, "cold": cold})
    api = await start(aiohttp_client, settings, clock)
    rng = random.Random(10)
    files = [rng.randbytes(500_000) for _ in range(2)]
    ids = [(await api.save("staged", {"w": data}))["id"] for data in files]
    clock.advance(2 * 86400)
    await api.json(
        "PUT",
        "/v1/namespaces/staged/policy",
        json={
            "tiering": {
                "target": "warm",
                "demote_after": "1d",
                "keep_hot_last": 0,
                "stages": [{"tier": "cold", "after": "7d"}],
            }
        },
    )
    await api.json("POST", "/v1/admin/tiering?dry_run=false")
    for cid in ids:
        assert (await api.json("GET", f"/v1/namespaces/staged/checkpoints/{cid}"))["tier"] == "warm"
    clock.advance(7 * 86400)
    done = await api.json("POST", "/v1/admin/tiering?dry_run=false")
    assert done["moved"]["cold"]["from_other_tiers"]["chunks_moved"] > 0
    stats = await api.json("GET", "/v1/stats")
    assert stats["tiers"]["warm"]["chunks"] == 0
    assert not [p for p in (tmp_path / "warm").rglob("*") if p.is_file()]  # packs left behind went
    for cid, data in zip(ids, files, strict=True):
        rec = await api.json("GET", f"/v1/namespaces/staged/checkpoints/{cid}")
        assert rec["tier"] == "cold"
        assert await api.read("staged", cid, "w") == data
    assert (await api.json("POST", "/v1/admin/check"))["ok"] is True
