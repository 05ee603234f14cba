"""The scheduled GC and the admin GC route both repack when tiers exist (one task,
`maintenance.gc`): what GC freed in packs is dead bytes. Routes wait for
maintenance in progress; scheduled jobs do not."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from checkpoint_vault import maintenance
from checkpoint_vault.api import Settings, create_app
from checkpoint_vault.api.jobs import run_job
from checkpoint_vault.api.keys import JOBS, VAULT
from checkpoint_vault.api.settings import Maintenance
from checkpoint_vault.protocol import GcReport
from checkpoint_vault.tiering import MemoryTier
from checkpoint_vault.tiering.runner import run_tiering
from checkpoint_vault.vault import FakeClock, MaintenanceBusy, Vault, VaultConfig

from ...conftest import Api
from ..vault.helpers import stream_save


def test_scheduled_gc_repacks_what_it_freed(tmp_path: Path) -> None:
    cold = MemoryTier("cold")
    vault = Vault(tmp_path / "v", VaultConfig(gc_grace=0.0), FakeClock(), tiers={"cold": cold})
    try:
        rng = random.Random(1)
        recs = [stream_save(vault, "ns", {"w": rng.randbytes(150_000)}) for _ in range(4)]
        vault.set_policy("ns", {"tiering": {"target": "cold", "keep_hot_last": 0}})
        run_tiering(vault)
        for rec in recs[:3]:
            vault.lifecycle.delete("ns", rec.id)
        vault.store.clock.advance(7 * 3600)  # type: ignore[attr-defined]  # past the upload TTL
        result = maintenance.scheduled(vault, None, None)["gc"]()
        assert isinstance(result, GcReport)
        assert result.chunks_deleted > 0
        assert result.packs_rewritten == 1
        assert result.pack_bytes_freed is not None
        assert result.pack_bytes_freed > 300_000
        assert vault.stats().tiers["cold"].bytes == sum(
            len(cold.get(k)) for k in cold.list("packs/") if not k.endswith(".idx")
        )
    finally:
        vault.close()


async def start(aiohttp_client: Any, tmp_path: Path, clock: FakeClock) -> Api:
    settings = Settings(
        data_dir=tmp_path / "data",
        vault=VaultConfig(map_size=4 << 20, gc_grace=0.0),
        tiers={"cold": {"url": "memory://"}},
    )
    client = await aiohttp_client(create_app(settings, clock))
    token = (settings.data_dir / "admin.token").read_text().strip()
    return Api(client, token, settings.data_dir)


async def test_admin_gc_route_repacks_like_the_schedule(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    api = await start(aiohttp_client, tmp_path, clock)
    rng = random.Random(1)
    ids = [(await api.save("ns", {"w": rng.randbytes(150_000)}))["id"] for _ in range(4)]
    await api.json(
        "PUT", "/v1/namespaces/ns/policy", json={"tiering": {"target": "cold", "keep_hot_last": 0}}
    )
    moved = await api.json("POST", "/v1/admin/tiering?dry_run=false")
    assert moved["moved"]["cold"]["chunks"] > 0
    for cid in ids[:3]:
        await api.call("DELETE", f"/v1/namespaces/ns/checkpoints/{cid}", expect=204)
    clock.advance(7 * 3600)  # past the upload TTL

    dry = await api.json("POST", "/v1/admin/gc?dry_run=true")
    assert dry["chunks_deleted"] > 0
    assert "packs_rewritten" not in dry
    result = await api.json("POST", "/v1/admin/gc")
    assert result["chunks_deleted"] > 0
    assert result["packs_rewritten"] == 1
    assert result["pack_bytes_freed"] > 300_000
    vault = api.client.server.app[VAULT]
    cold = vault.store.tiers["cold"]
    stats = await api.json("GET", "/v1/stats")
    assert stats["tiers"]["cold"]["bytes"] == sum(
        len(cold.get(k)) for k in cold.list("packs/") if not k.endswith(".idx")
    )
    assert api.client.server.app[JOBS].runs[("gc", "ok")] == 2
    assert await api.read("ns", ids[3], "w")
    assert (await api.json("POST", "/v1/admin/check"))["ok"] is True


async def test_routes_wait_for_maintenance_and_the_schedule_skips(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    api = await start(aiohttp_client, tmp_path, clock)
    app = api.client.server.app
    vault = app[VAULT]
    held, release = threading.Event(), threading.Event()

    def operator() -> None:  # another maintenance run, on a thread of this process
        with vault.maintenance.hold("verify"):
            held.set()
            release.wait(30)

    t = threading.Thread(target=operator)
    t.start()
    try:
        assert await asyncio.to_thread(held.wait, 10)
        route = asyncio.ensure_future(api.json("POST", "/v1/admin/gc"))
        assert await asyncio.to_thread(vault.maintenance.wait_for_waiters, 1, 30)  # blocked
        assert not route.done(), "the route ran while maintenance was busy"
        assert (await api.json("GET", "/v1/health"))["status"] == "ok"  # the loop is free
        # Not waiting means for the queue too: the route's gc is ahead of it.
        with pytest.raises(MaintenanceBusy, match=r"maintenance is busy \(gc is running\)"):
            await run_job(app, "gc", vault.gc, timeout=0)
    finally:
        release.set()
        await asyncio.to_thread(t.join, 10)
    assert (await route)["chunks_deleted"] == 0


async def test_a_scheduled_job_that_finds_maintenance_busy_is_skipped(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        vault=VaultConfig(map_size=4 << 20),
        maintenance=Maintenance(
            retention_interval=0, gc_interval=0.05, scrub_interval=0, tiering_interval=0
        ),
    )
    caplog.set_level(logging.INFO, logger="ckpt.maintenance")
    client = await aiohttp_client(create_app(settings, clock))
    app = client.server.app
    held, release = threading.Event(), threading.Event()

    def operator() -> None:
        with app[VAULT].maintenance.hold("check --repair"):
            held.set()
            release.wait(30)

    t = threading.Thread(target=operator)
    t.start()
    try:
        assert await asyncio.to_thread(held.wait, 10)
        for _ in range(200):  # bounded: until the schedule has tried gc and given up
            if "maintenance gc skipped" in caplog.text:
                break
            await asyncio.sleep(0.05)
        assert app[VAULT].maintenance.waiters == 0  # a scheduled job never waits
        assert ("gc", "ok") not in app[JOBS].runs
        assert ("gc", "error") not in app[JOBS].runs
        assert "maintenance gc skipped: gc: maintenance is busy (check --repair" in caplog.text
    finally:
        release.set()
        await asyncio.to_thread(t.join, 10)
    for _ in range(100):  # then it runs at its next interval
        if app[JOBS].runs.get(("gc", "ok")):
            break
        await asyncio.sleep(0.05)
    assert app[JOBS].runs[("gc", "ok")] >= 1
