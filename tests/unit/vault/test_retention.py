"""Retention planning as a pure function, and plan == apply on a real engine."""

from __future__ import annotations

from datetime import datetime, timezone

from checkpoint_vault.vault import Vault
from checkpoint_vault.vault.clock import FakeClock
from checkpoint_vault.vault.policy import KeepBest, Retention
from checkpoint_vault.vault.records import StoredCheckpoint, Validity
from checkpoint_vault.vault.retention import plan_namespace

from .helpers import stream_save


def ts(*args: int) -> float:
    return datetime(*args, tzinfo=timezone.utc).timestamp()


def rec(i: int, at: float, **kw: object) -> StoredCheckpoint:
    base: dict[str, object] = {"metadata": {}, "tags": [], "files": {}, "size": 0}
    base.update(kw)
    return StoredCheckpoint(id=f"c{i:03d}", namespace="ns", parent=None, created_at=at, **base)  # type: ignore[arg-type]


def kept(records: list[StoredCheckpoint], policy: Retention, now: float = 0.0) -> set[str]:
    return set(plan_namespace("ns", records, policy, now).keep)


def test_monthly_buckets_cross_year_boundaries_in_utc() -> None:
    times = [
        ts(2025, 12, 31, 23, 59),
        ts(2026, 1, 1, 0, 1),
        ts(2026, 1, 31, 23, 0),
        ts(2026, 2, 1, 0, 0),
        ts(2026, 2, 15),
    ]
    records = [rec(i, t) for i, t in enumerate(times)][::-1]  # newest first
    assert kept(records, Retention(keep_monthly=3, keep_valid_min=0)) == {"c004", "c002", "c000"}
    assert kept(records, Retention(keep_monthly=10, keep_valid_min=0)) == {"c004", "c002", "c000"}


def test_daily_hourly_and_weekly_buckets() -> None:
    times = [
        ts(2026, 3, 1, 10),
        ts(2026, 3, 1, 10, 30),
        ts(2026, 3, 1, 11),
        ts(2026, 3, 2, 9),
        ts(2026, 3, 9, 9),
    ]
    records = [rec(i, t) for i, t in enumerate(times)][::-1]
    assert kept(records, Retention(keep_daily=2, keep_valid_min=0)) == {"c004", "c003"}
    assert kept(records, Retention(keep_hourly=3, keep_valid_min=0)) == {"c004", "c003", "c002"}
    # 2026-03-01 is a Sunday: ISO week 9; 03-02 opens week 10, 03-09 week 11
    assert kept(records, Retention(keep_weekly=3, keep_valid_min=0)) == {"c004", "c003", "c002"}


def test_within_tags_best_and_last() -> None:
    now = ts(2026, 5, 10)
    records = [
        rec(4, now - 3600, metadata={"loss": 0.9}),
        rec(3, now - 86400 * 2, metadata={"loss": 0.1}),
        rec(2, now - 86400 * 3, tags=["release"], metadata={"loss": 0.5}),
        rec(1, now - 86400 * 4, metadata={"loss": 0.2}),
        rec(0, now - 86400 * 5, metadata={"loss": "n/a"}),
    ]
    policy = Retention(
        keep_last=1,
        keep_within=86400 * 2.5,
        keep_tags=("release",),
        keep_best=KeepBest("loss", "min", 2),
        keep_valid_min=0,
    )
    plan = plan_namespace("ns", records, policy, now)
    assert plan.delete == ["c000"]
    assert plan.keep["c004"] == ["last", "within"]
    assert plan.keep["c003"] == ["within", "best:loss"]
    assert plan.keep["c002"] == ["tag:release"]
    assert plan.keep["c001"] == ["best:loss"]


def test_valid_min_survives_when_every_newer_checkpoint_is_invalid() -> None:
    records = [rec(i, 1000.0 + i, validity=Validity("invalid")) for i in range(5, 1, -1)]
    records += [rec(1, 1001.0), rec(0, 1000.0)]
    plan = plan_namespace("ns", records, Retention(keep_last=2, keep_valid_min=1), 2000.0)
    assert plan.keep == {"c005": ["last"], "c004": ["last"], "c001": ["valid_min"]}


def test_pinned_survives_everything_and_no_rules_keeps_all() -> None:
    records = [rec(2, 3.0), rec(1, 2.0, pinned=True), rec(0, 1.0)]
    plan = plan_namespace("ns", records, Retention(keep_last=1, keep_valid_min=0), 10.0)
    assert plan.delete == ["c000"]
    assert plan.keep["c001"] == ["pinned"]
    assert kept(records, Retention()) == {"c002", "c001", "c000"}


def test_plan_then_apply_deletes_exactly_the_plan(vault: Vault, clock: FakeClock) -> None:
    ids = []
    for i in range(6):
        ids.append(stream_save(vault, "ns", {"f": bytes([i]) * 70_000}).id)
        clock.advance(3600)
    vault.lifecycle.patch("ns", ids[0], pinned=True)
    vault.set_policy("ns", {"retention": {"keep_last": 2}})
    plan = vault.retention(dry_run=True)
    assert plan.delete == [ids[3], ids[2], ids[1]]
    assert plan.to_wire()["delete"] == [ids[3], ids[2], ids[1]]
    assert plan.reclaimable_bytes > 0
    assert len(vault.checkpoints("ns")[0]) == 6  # a dry run changes nothing
    stored = vault.stats().stored_bytes
    done = vault.retention(dry_run=False)
    assert done.deleted == [ids[3], ids[2], ids[1]]
    assert [r.id for r in vault.checkpoints("ns")[0]] == [ids[5], ids[4], ids[0]]
    clock.advance(vault.config.upload_ttl + vault.config.gc_grace + 1)
    freed = vault.gc().bytes_freed
    assert freed == plan.reclaimable_bytes
    assert vault.stats().stored_bytes == stored - freed
    assert vault.check().ok


def test_policy_put_merges_and_default_applies(vault: Vault) -> None:
    stream_save(vault, "a", {"f": b"x"})
    vault.set_policy(None, {"retention": {"keep_last": 5, "keep_within": "7d"}})
    vault.set_policy("a", {"retention": {"keep_daily": 3}})
    vault.set_policy("a", {"retention": {"keep_tags": ["keep"]}, "tiering": {"target": "cold"}})
    pol = vault.policy("a").to_record().to_wire()
    assert pol["retention"]["keep_daily"] == 3
    assert pol["retention"]["keep_tags"] == ["keep"]
    assert pol["tiering"] == {"target": "cold"}
    assert vault.policy(None).to_record().retention.keep_within == "1w"
