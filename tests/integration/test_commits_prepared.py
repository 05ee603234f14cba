"""A prepared upload on one process of a cluster (a one-shard cluster whose store is a
directory): invisible until its transaction's decision, applied by the first read of its
namespace once the decision is `commit`, released by the resolver once undecided past
`txn_timeout`, and closed to every other change meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from checkpoint_vault.api import Settings
from checkpoint_vault.cluster import ClusterConfig
from checkpoint_vault.cluster.shards import upload_prefix
from checkpoint_vault.cluster.txn import ABORT, COMMIT, Decisions
from checkpoint_vault.tiering import open_tier
from checkpoint_vault.vault import FakeClock, VaultConfig

from ..conftest import Api

TIMEOUT = 30.0


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    cluster = ClusterConfig(
        node="solo",
        url="http://127.0.0.1:9",
        shards=1,
        store=(tmp_path / "cluster").as_uri(),
        txn_timeout=TIMEOUT,
    )
    vault = VaultConfig(map_size=4 << 20, gc_grace=0.0, upload_id_prefix=upload_prefix(0))
    return Settings(data_dir=tmp_path / "data", vault=vault, cluster=cluster)


def _decisions(settings: Settings) -> Decisions:
    assert settings.cluster is not None
    return Decisions(open_tier("cluster", settings.cluster.store), "test")


async def _poll(what: str, check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """Poll `check` on the loop the in-process server runs on (bounded)."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.05)  # polling a condition, bounded


async def _prepared(api: Api, ns: str, txn: str) -> str:
    up = await api.open(ns)
    upload = str(up["upload_id"])
    await api.json("PUT", f"/v1/uploads/{upload}/files/f", expect=201, data=b"state " * 100)
    body = {"transaction": txn, "namespace": ns}
    await api.json("POST", f"/v1/uploads/{upload}/prepare", expect=200, json=body)
    await api.json("POST", f"/v1/uploads/{upload}/prepare", expect=200, json=body)  # again
    return upload


async def test_invisible_until_committed_then_applied_by_a_read(
    api: Api, settings: Settings
) -> None:
    txn = "c0" * 16
    upload = await _prepared(api, "agents/a", txn)
    await api.call("GET", "/v1/namespaces/agents/a/checkpoints/latest", expect=404)
    # a prepared upload takes nothing more, is not committed or aborted outside its
    # transaction, and is not resolved before a decision
    await api.call("PUT", f"/v1/uploads/{upload}/files/g", expect=409, data=b"more")
    await api.call("POST", f"/v1/uploads/{upload}/commit", expect=409, json={})
    await api.call("DELETE", f"/v1/uploads/{upload}", expect=409)
    resolve = {"transaction": txn}
    await api.call("POST", f"/v1/uploads/{upload}/resolve", expect=409, json=resolve)
    assert _decisions(settings).decide(txn, COMMIT) == COMMIT
    assert _decisions(settings).decide(txn, ABORT) == COMMIT  # the first decision holds
    rec = await api.json("GET", "/v1/namespaces/agents/a/checkpoints/latest")
    assert await api.read("agents/a", rec["id"], "f") == b"state " * 100
    again = await api.json("POST", f"/v1/uploads/{upload}/resolve", json=resolve)
    assert again["id"] == rec["id"]


async def test_undecided_past_the_timeout_is_aborted_and_released(
    api: Api, settings: Settings, clock: FakeClock
) -> None:
    txn = "a0" * 16
    upload = await _prepared(api, "agents/b", txn)
    clock.advance(TIMEOUT + 1)

    async def aborted() -> bool:
        return _decisions(settings).read(txn) == ABORT

    async def released() -> bool:  # open again: a plain commit (or a new transaction) takes it
        resp = await api.call("POST", f"/v1/uploads/{upload}/commit", json={})
        return resp.status == 201

    await _poll("the resolver's abort", aborted)
    await _poll("the upload released", released)
    rec = await api.json("GET", "/v1/namespaces/agents/b/checkpoints/latest")
    assert rec["files"]["f"]["size"] == 600
    # the aborted transaction commits nothing any more
    resp = await api.call("POST", f"/v1/uploads/{upload}/resolve", json={"transaction": txn})
    assert resp.status == 409
