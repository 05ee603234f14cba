"""Policies, retention, verify and the maintenance schedule over HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from checkpoint_vault.api import Settings, create_app
from checkpoint_vault.api.settings import Maintenance
from checkpoint_vault.vault import FakeClock, VaultConfig

from ..conftest import Api


async def test_policy_routes_merge_and_validate(api: Api) -> None:
    await api.save("pol/a", {"f": b"x"})
    assert (await api.json("GET", "/v1/namespaces/pol/a/policy"))["retention"]["keep_last"] is None
    out = await api.json(
        "PUT",
        "/v1/namespaces/pol/a/policy",
        json={"retention": {"keep_last": 3, "keep_within": "36h"}},
    )
    assert out["retention"]["keep_last"] == 3
    out = await api.json(
        "PUT",
        "/v1/namespaces/pol/a/policy",
        json={"retention": {"keep_best": {"metric": "loss", "mode": "min", "n": 2}}},
    )
    assert out["retention"]["keep_last"] == 3
    assert out["retention"]["keep_within"] == "36h"
    assert out["retention"]["keep_best"] == {"metric": "loss", "mode": "min", "n": 2}
    await api.json("PUT", "/v1/policy/default", json={"retention": {"keep_daily": 7}})
    assert (await api.json("GET", "/v1/policy/default"))["retention"]["keep_daily"] == 7
    for bad in [
        {"retention": {"keep_last": -1}},
        {"retention": {"keep_within": "soon"}},
        {"retention": {"nope": 1}},
        {"other": {}},
    ]:
        err = await api.json("PUT", "/v1/namespaces/pol/a/policy", expect=400, json=bad)
        assert err["error"]["code"] == "invalid_request"
    await api.call("GET", "/v1/namespaces/pol/none/policy", expect=404)
    reader = await api.token_for("read:*")
    await api.call("GET", "/v1/namespaces/pol/a/policy", token=reader, expect=403)


async def test_retention_plan_then_apply_over_http(api: Api, clock: FakeClock) -> None:
    ids = []
    for i in range(5):
        ids.append(
            (
                await api.save(
                    "ret", {"f": bytes([i]) * 1000}, metadata={"loss": 5 - i if i != 1 else 0.1}
                )
            )["id"]
        )
        clock.advance(60)
    await api.json(
        "PUT",
        "/v1/namespaces/ret/policy",
        json={
            "retention": {"keep_last": 1, "keep_best": {"metric": "loss", "mode": "min", "n": 1}}
        },
    )
    plan = await api.json("POST", "/v1/admin/retention?dry_run=true")
    assert plan["delete"] == [ids[3], ids[2], ids[0]]
    assert plan["namespaces"]["ret"]["keep"] == {
        ids[4]: ["last", "valid_min"],
        ids[1]: ["best:loss"],
    }
    assert len((await api.json("GET", "/v1/namespaces/ret/checkpoints"))["checkpoints"]) == 5
    done = await api.json("POST", "/v1/admin/retention?dry_run=false")
    assert done["deleted"] == plan["delete"]
    left = (await api.json("GET", "/v1/namespaces/ret/checkpoints"))["checkpoints"]
    assert [r["id"] for r in left] == [ids[4], ids[1]]
    chain = await api.json("GET", f"/v1/namespaces/ret/checkpoints/{ids[4]}/lineage")
    assert chain["chain"][0]["id"] == ids[4]


async def test_verify_route_reports(api: Api) -> None:
    await api.save("ver", {"f": b"payload" * 1000})
    report = await api.json("POST", "/v1/admin/verify?sample=1")
    assert report["chunks_checked"] >= 1
    assert report["corrupt"] == []
    assert report["checkpoints_invalidated"] == []
    await api.json("POST", "/v1/admin/verify?sample=2", expect=400)


@pytest.fixture
def scheduled(tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        vault=VaultConfig(map_size=4 << 20, gc_grace=0.0, upload_ttl=0.5),
        maintenance=Maintenance(
            retention_interval=0.05, gc_interval=0.05, scrub_interval=0.05, scrub_rate=0
        ),
    )


async def test_schedule_applies_retention_and_collects(
    aiohttp_client: Any, scheduled: Settings
) -> None:
    client = await aiohttp_client(create_app(scheduled))
    token = (scheduled.data_dir / "admin.token").read_text().strip()
    api = Api(client, token, scheduled.data_dir)
    await api.json("PUT", "/v1/policy/default", json={"retention": {"keep_last": 1}})
    for i in range(3):
        await api.save("sched", {"f": bytes([i]) * 5000})
    for _ in range(200):  # bounded: the schedule runs every 50 ms
        left = (await api.json("GET", "/v1/namespaces/sched/checkpoints"))["checkpoints"]
        stats = await api.json("GET", "/v1/stats")
        if len(left) == 1 and stats["chunks"] == 1:
            break
        await asyncio.sleep(0.05)
    assert len(left) == 1
    assert stats["chunks"] == 1
