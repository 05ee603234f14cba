"""Which records of a thread to delete so that only its newest checkpoints remain.

A pure function of the thread's records (newest first) and how many checkpoints to keep
per `checkpoint_ns`; the saver lists, plans, then deletes exactly the plan. Rules:

- the newest `keep` checkpoint records of each checkpoint_ns stay, those of a subgraph only
  while the parent graph's checkpoint they belong to stays; every pinned record stays (the
  vault refuses to delete those anyway);
- a kept checkpoint whose metadata still counts steps since a `DeltaChannel` snapshot
  (`counters_since_delta_snapshot`) needs its ancestors back to that snapshot to rebuild
  the channel, so they stay too (langgraph-checkpoint's warning on `prune`);
- a writes record stays with its checkpoint; writes for an id newer than every checkpoint
  of its checkpoint_ns stay as well: they arrived before their checkpoint's put finished
  (LangGraph sends them concurrently) and that checkpoint is about to exist;
- records this integration did not write are never touched.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..models import Checkpoint as Record
from ._layout import KIND_CHECKPOINT, Ref


def plan_prune(records: Sequence[Record], keep: int) -> list[Record]:
    """The records to delete; `records` newest first, `keep` >= 1."""
    if keep < 1:
        raise ValueError("keep at least one checkpoint per checkpoint_ns")
    refs = [(rec, Ref.of(rec)) for rec in records]
    checkpoints = [(rec, r) for rec, r in refs if r and r.kind == KIND_CHECKPOINT]
    newest: dict[str, str] = {}  # checkpoint_ns -> largest checkpoint id seen
    for _, cp in checkpoints:
        newest[cp.checkpoint_ns] = max(newest.get(cp.checkpoint_ns, ""), cp.checkpoint_id)
    kept = _newest_with_parents(checkpoints, keep)
    kept |= _delta_ancestors(checkpoints, kept)
    doomed = []
    for rec, ref in refs:
        if ref is None or rec.pinned:
            continue
        if (ref.checkpoint_ns, ref.checkpoint_id) in kept:
            continue
        if ref.kind != KIND_CHECKPOINT and ref.checkpoint_id > newest.get(ref.checkpoint_ns, ""):
            continue  # early writes of a checkpoint still being saved
        doomed.append(rec)
    return doomed


def _newest_with_parents(
    checkpoints: Sequence[tuple[Record, Ref]], keep: int
) -> set[tuple[str, str]]:
    """The newest `keep` of each checkpoint_ns; for a subgraph's checkpoint_ns, only those
    whose parent graphs' checkpoints (metadata `parents`) stay. Each run of a subgraph has
    a checkpoint_ns of its own, so "newest per checkpoint_ns" alone would keep a few of
    every run ever made; its checkpoints matter only while their parent checkpoint does."""
    kept: set[tuple[str, str]] = set()
    count: dict[str, int] = {}
    # Outer graphs first ('|' separates nesting levels), so parents are decided before.
    for rec, cp in sorted(checkpoints, key=lambda c: c[1].checkpoint_ns.count("|")):
        ns = cp.checkpoint_ns
        if count.get(ns, 0) >= keep:
            continue
        parents = (rec.metadata.get("metadata") or {}).get("parents") or {}
        if ns and not all((pns, str(pid)) in kept for pns, pid in parents.items()):
            continue
        count[ns] = count.get(ns, 0) + 1
        kept.add((ns, cp.checkpoint_id))
    return kept


def _delta_ancestors(
    checkpoints: Sequence[tuple[Record, Ref]], kept: set[tuple[str, str]]
) -> set[tuple[str, str]]:
    """Ancestors of kept checkpoints back to the nearest DeltaChannel snapshot."""
    by_key = {(ref.checkpoint_ns, ref.checkpoint_id): rec for rec, ref in checkpoints}
    extra: set[tuple[str, str]] = set()
    for key in kept:
        rec = by_key.get(key)
        while rec is not None and (rec.metadata.get("metadata") or {}).get(
            "counters_since_delta_snapshot"
        ):
            parent = rec.metadata.get("parent_checkpoint_id")
            if not parent:
                break
            pkey = (key[0], str(parent))
            if pkey in extra or pkey in kept:
                break
            extra.add(pkey)
            rec = by_key.get(pkey)
    return extra
