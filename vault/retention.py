"""Retention planning: which checkpoints a policy keeps, and why.

A pure function of the namespace's live checkpoints (newest first), the policy and `now`:
the same inputs always give the same plan, so a dry run shows exactly what applying will do.
Buckets follow restic's `forget --keep-*`: walking newest to oldest, the first checkpoint
seen in each hour/day/week/month (UTC) is kept, until n buckets are filled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from checkpoint_vault.protocol import RetentionPlan

from .policy import Retention
from .records import StoredCheckpoint


@dataclass
class NamespacePlan:
    namespace: str
    keep: dict[str, list[str]] = field(default_factory=dict)  # id -> reasons
    delete: list[str] = field(default_factory=list)
    reclaimable_bytes: int = 0

    def to_record(self) -> RetentionPlan:
        return RetentionPlan(self.keep, self.delete, self.reclaimable_bytes)


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=timezone.utc)


_BUCKETS: dict[str, Callable[[datetime], tuple[int, ...]]] = {
    "keep_hourly": lambda d: (d.year, d.month, d.day, d.hour),
    "keep_daily": lambda d: (d.year, d.month, d.day),
    "keep_weekly": lambda d: tuple(d.isocalendar()[:2]),
    "keep_monthly": lambda d: (d.year, d.month),
}


def plan_namespace(
    ns: str, records: Sequence[StoredCheckpoint], policy: Retention, now: float
) -> NamespacePlan:
    """`records`: live checkpoints, newest first."""
    plan = NamespacePlan(ns)
    reasons: dict[str, list[str]] = {r.id: [] for r in records}
    for rule in _RULES:
        for rec, why in rule(records, policy, now):
            reasons[rec.id].append(why)
    for rec in records:
        if reasons[rec.id]:
            plan.keep[rec.id] = reasons[rec.id]
        else:
            plan.delete.append(rec.id)
    return plan


Kept = Iterator[tuple[StoredCheckpoint, str]]


def _pinned(records: Sequence[StoredCheckpoint], policy: Retention, now: float) -> Kept:
    return ((r, "pinned") for r in records if r.pinned)


def _no_rules(records: Sequence[StoredCheckpoint], policy: Retention, now: float) -> Kept:
    return ((r, "no retention rules") for r in records if not policy.has_rules)


def _last(records: Sequence[StoredCheckpoint], policy: Retention, now: float) -> Kept:
    return ((r, "last") for r in records[: policy.keep_last or 0])


def _buckets(records: Sequence[StoredCheckpoint], policy: Retention, now: float) -> Kept:
    for rule, bucket_of in _BUCKETS.items():
        n = getattr(policy, rule) or 0
        seen: set[tuple[int, ...]] = set()
        for rec in records:
            if len(seen) >= n:
                break
            bucket = bucket_of(_utc(rec.created_at))
            if bucket not in seen:
                seen.add(bucket)
                yield rec, rule.removeprefix("keep_")


def _within(records: Sequence[StoredCheckpoint], policy: Retention, now: float) -> Kept:
    if policy.keep_within is None:
        return iter(())
    cutoff = now - policy.keep_within
    return ((r, "within") for r in records if r.created_at >= cutoff)


def _tags(records: Sequence[StoredCheckpoint], policy: Retention, now: float) -> Kept:
    return ((r, f"tag:{t}") for t in policy.keep_tags for r in records if t in r.tags)


def _best(records: Sequence[StoredCheckpoint], policy: Retention, now: float) -> Kept:
    best = policy.keep_best
    if best is None or not best.n:
        return iter(())
    scored = [(v, r) for r in records if (v := _number(r.metadata.get(best.metric))) is not None]
    scored.sort(key=lambda vr: vr[0], reverse=best.mode == "max")
    return ((r, f"best:{best.metric}") for _, r in scored[: best.n])


def _valid_min(records: Sequence[StoredCheckpoint], policy: Retention, now: float) -> Kept:
    valid = [r for r in records if r.validity.state != "invalid"]
    return ((r, "valid_min") for r in valid[: policy.keep_valid_min])


_RULES = (_pinned, _no_rules, _last, _buckets, _within, _tags, _best, _valid_min)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
