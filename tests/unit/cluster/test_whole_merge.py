"""The merges of api/cluster/whole.py on records: the storage chart's step sum over shards
that sample at their own moments, and the stats' sums."""

from __future__ import annotations

from checkpoint_vault.api.cluster.whole import merge_samples, merge_stats
from checkpoint_vault.protocol import (
    NamespaceBytes,
    QuotaUse,
    StatsReport,
    StorageSample,
    TierTotals,
)


def sample(at: float, logical: int | None, ns: str) -> StorageSample:
    stored = None if logical is None else logical // 2
    return StorageSample(at, logical, stored, 10, {ns: NamespaceBytes(logical or 0, 0)})


def test_history_is_the_step_sum_from_when_every_shard_sampled() -> None:
    a = [sample(1.0, 100, "a"), sample(5.0, 300, "a")]
    b = [sample(3.0, 20, "b"), sample(4.0, 40, "b")]
    merged = merge_samples([a, b, []])  # a shard that never sampled adds nothing
    assert [(s.at, s.logical_bytes, s.disk_bytes) for s in merged] == [
        (3.0, 120, 20),  # a's sample of 1.0 still stood
        (4.0, 140, 20),
        (5.0, 340, 20),
    ]
    assert sorted(merged[-1].namespaces) == ["a", "b"]
    # a shard's totals hidden (a token without admin): the sum is hidden too
    hidden = merge_samples([[sample(1.0, None, "a")], [sample(2.0, 5, "b")]])
    assert [(s.at, s.logical_bytes) for s in hidden] == [(2.0, None)]
    assert merge_samples([[], []]) == []


def report(logical: int, stored: int, quota_used: int) -> StatsReport:
    return StatsReport(
        logical_bytes=logical,
        stored_bytes=stored,
        chunks=2,
        checkpoints=1,
        namespaces=1,
        dedup_ratio=None,
        tiers={"hot": TierTotals(2, stored)},
        codecs={},
        map_size=1 << 20,
        quotas=[QuotaUse("t-*", 1000, quota_used)],
        role="primary",
        replication=None,
        standby=None,
        disk_bytes=None,
    )


def test_stats_are_the_sums_and_quotas_each_shards() -> None:
    whole = merge_stats((1, report(300, 100, 30)), [(0, report(100, 100, 10))])
    assert (whole.logical_bytes, whole.stored_bytes, whole.chunks) == (400, 200, 4)
    assert whole.dedup_ratio == 2.0
    assert whole.tiers == {"hot": TierTotals(4, 200)}
    assert whole.disk_bytes is None  # not known for every shard
    assert [(q.shard, q.used) for q in whole.quotas] == [(0, 10), (1, 30)]
