"""One tiering run: plan, move each target's chunks, bring back what rules hold hot, then
say on each checkpoint record where its bytes now are (`tier`: hot, a tier's name, or
mixed). Also promotion on read, one checkpoint at a time.

`run_tiering` is a maintenance operation: it runs under the vault's maintenance lock
(vault/maintenance.py), which `maintenance.run` holds around the tiering task, so the
schedule, the admin route and the offline command exclude each other and GC. Promotion on
read does not need it: it uploads no packs, and it switches a chunk only if the chunk is
still where it was read."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

from checkpoint_vault.protocol import MoveSummary, RepackSummary, TieringReport
from checkpoint_vault.vault import StoredCheckpoint, Vault
from checkpoint_vault.vault.content import MoveReport, Packed
from checkpoint_vault.vault.content.chunks import ChunkMeta
from checkpoint_vault.vault.manifest import distinct_chunks
from checkpoint_vault.vault.snapshot import Snapshot

from . import repack
from .policy import plan


def run_tiering(
    vault: Vault, dry_run: bool = False, stop: threading.Event | None = None
) -> TieringReport:
    """Plan, or run the plan. `stop` set (SIGTERM): stop before the next batch of any of
    its moves (`MaintenanceStopped`); what moved so far is switched and stays so, and
    checkpoint records' `tier` is refreshed by the next run."""
    tiering_plan = plan(vault, vault.clock.now())
    below = repack_threshold(vault)
    if dry_run:
        sparse = repack.plan(vault, below)
        dead = sum(p.size - p.live_bytes for p in sparse)
        return tiering_plan.report(True, RepackSummary(len(sparse), below, dead_bytes=dead))
    moved: dict[str, MoveSummary] = {}
    for target, chunks in tiering_plan.moves.items():
        if chunks:
            demoted = vault.content.demote(target, sorted(chunks), stop=stop)
            moved[target] = _summary(demoted)
    for target, items in tiering_plan.transfers.items():
        todo = sorted(items, key=_by_place)
        report = repack.move_packed(vault, target, todo, stop=stop)
        move = moved.get(target) or _summary(MoveReport())
        moved[target] = replace(move, from_other_tiers=_repacked(report))
    promoted = _summary(vault.content.promote(sorted(tiering_plan.promote), stop))
    retiered = retier(vault)
    repacked = _repacked(repack.repack(vault, below, stop=stop), below)
    return replace(
        tiering_plan.report(False, repacked), moved=moved, promoted=promoted, retiered=retiered
    )


def _repacked(report: repack.RepackReport, below: float | None = None) -> RepackSummary:
    return RepackSummary(
        packs=report.packs,
        below=below,
        rewritten=report.rewritten,
        deleted=report.deleted,
        new_packs=report.new_packs,
        chunks_moved=report.chunks_moved,
        dead_bytes_freed=report.dead_bytes_freed,
        seconds=round(report.seconds, 3),
    )


def repack_threshold(vault: Vault) -> float:
    """`repack_below` of the default policy: packs are shared by all namespaces."""
    with vault.snapshot() as snap:
        policy = snap.own_policy(None)
    value = policy.tiering.get("repack_below") if policy is not None else None
    return float(value) if value is not None else repack.DEFAULT_REPACK_BELOW


def _by_place(item: tuple[bytes, Packed]) -> tuple[str, str, int]:
    """Read packs in order: adjacent frames come in one range request."""
    return item[1].tier, item[1].key, item[1].offset


def _summary(report: MoveReport) -> MoveSummary:
    return MoveSummary(
        chunks=report.chunks_moved,
        bytes=report.bytes_moved,
        packs=report.packs,
        skipped=report.skipped,
        seconds=round(report.seconds, 3),
        mb_per_s=round(report.mb_per_s, 1),
    )


def wants_promotion(vault: Vault, ns: str, record: StoredCheckpoint) -> bool:
    """A read of this checkpoint should bring its bytes back hot (policy promote_on_read)."""
    if record.tier == "hot":
        return False
    with vault.snapshot() as snap:
        return bool(snap.policy_for(ns).tiering.get("promote_on_read", False))


@dataclass(frozen=True)
class Promoted:
    """One checkpoint promoted on read: what came back hot, and whether its `tier`
    changed (`retiered` holds its id if so)."""

    checkpoint: str
    moved: MoveSummary
    retiered: list[str]


def promote_checkpoint(vault: Vault, ns: str, ckpt_id: str) -> Promoted:
    """Promotion on read: note the read (the checkpoint ages from it, so the next tiering
    run leaves it hot for `demote_after`), then bring its packed chunks back."""
    chunks = vault.lifecycle.note_promoted(ns, ckpt_id)
    with vault.snapshot() as snap:
        packed = [c for c in chunks if _place(snap.chunk(c)) not in ("hot", None)]
    report = vault.content.promote(sorted(packed))
    return Promoted(ckpt_id, _summary(report), retier(vault, [ckpt_id]))


def _place(meta: ChunkMeta | None) -> str | None:
    """`hot`, the name of the tier a chunk is packed in, or None if it is gone."""
    if meta is None:
        return None
    return meta.where.tier if isinstance(meta.where, Packed) else "hot"


def tier_of(snap: Snapshot, chunks: set[bytes]) -> str:
    places = {_place(snap.chunk(cid)) or "hot" for cid in chunks}
    if not places:
        return "hot"
    return places.pop() if len(places) == 1 else "mixed"


def retier(vault: Vault, only: list[str] | None = None) -> list[str]:
    """Recompute every live checkpoint's `tier` (or only those given); write the ones that
    changed."""
    changes: dict[str, str] = {}
    with vault.snapshot() as snap:
        listed = [(i, snap.manifest(i)) for i in only] if only is not None else snap.manifests()
        for ckpt_id, files in listed:
            rec = snap.record(ckpt_id)
            if rec is None or rec.is_tombstone:
                continue
            tier = tier_of(snap, distinct_chunks(files))
            if tier != rec.tier:
                changes[ckpt_id] = tier
    return vault.lifecycle.set_tiers(changes)
