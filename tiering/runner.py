"""One tiering run: plan, move each target's chunks, bring back what rules hold hot, then
say on each checkpoint record where its bytes now are (`tier`: hot, a tier's name, or
mixed). Also promotion on read, one checkpoint at a time.

`run_tiering` is a maintenance operation: it holds the vault's maintenance lock
(vault/maintenance.py) itself, so the schedule, the admin route and any tool calling it
exclude each other and GC. Promotion on read does not: it uploads no packs, and it switches
a chunk only if the chunk is still where it was read."""

from __future__ import annotations

from typing import Any

from vault import CheckpointRecord, Vault
from vault.blocks import PACKED, Location
from vault.maintenance import maintenance_operation
from vault.manifest import distinct_chunks
from vault.writer import WriteTxn

from . import repack
from .mover import MoveReport, demote, promote
from .policy import plan


@maintenance_operation("tiering")
def run_tiering(vault: Vault, dry_run: bool = False) -> dict[str, Any]:
    tiering_plan = plan(vault, vault.store.clock.now())
    out: dict[str, Any] = {"dry_run": dry_run, **tiering_plan.to_wire()}
    below = repack_threshold(vault)
    if dry_run:
        sparse = repack.plan(vault, below)
        out["repack"] = {
            "below": below,
            "packs": len(sparse),
            "dead_bytes": sum(p.size - p.live_bytes for p in sparse),
        }
        return out
    moved = {}
    for target, chunks in tiering_plan.moves.items():
        if chunks:
            moved[target] = _summary(demote(vault, target, sorted(chunks)))
    for target, items in tiering_plan.transfers.items():
        report = repack.move_packed(vault, target, sorted(items, key=_by_place))
        moved.setdefault(target, _summary(MoveReport()))["from_other_tiers"] = report.to_wire()
    out["moved"] = moved
    out["promoted"] = _summary(promote(vault, sorted(tiering_plan.promote)))
    out["retiered"] = retier(vault)
    out["repack"] = {"below": below, **repack.repack(vault, below).to_wire()}
    return out


def repack_threshold(vault: Vault) -> float:
    """`repack_below` of the default policy: packs are shared by all namespaces."""
    with vault.store.env.read() as txn:
        policy = vault.own_policy(txn, None)
    value = policy.tiering.get("repack_below") if policy is not None else None
    return float(value) if value is not None else repack.DEFAULT_REPACK_BELOW


def _by_place(item: tuple[bytes, Location]) -> tuple[str, str, int]:
    """Read packs in order: adjacent frames come in one range request."""
    return item[1].tier, item[1].key, item[1].offset


def _summary(report: MoveReport) -> dict[str, Any]:
    return {
        "chunks": report.chunks_moved,
        "bytes": report.bytes_moved,
        "packs": report.packs,
        "skipped": report.skipped,
        "seconds": round(report.seconds, 3),
        "mb_per_s": round(report.mb_per_s, 1),
    }


def wants_promotion(vault: Vault, ns: str, record: CheckpointRecord) -> bool:
    """A read of this checkpoint should bring its bytes back hot (policy promote_on_read)."""
    if record.tier == "hot":
        return False
    with vault.store.env.read() as txn:
        return bool(vault.policy_for(txn, ns).tiering.get("promote_on_read", False))


def promote_checkpoint(vault: Vault, ns: str, ckpt_id: str) -> dict[str, Any]:
    """Promotion on read: note the read (the checkpoint ages from it, so the next tiering
    run leaves it hot for `demote_after`), then bring its packed chunks back."""
    store = vault.store
    now = store.clock.now()

    def note(w: WriteTxn) -> set[bytes]:
        rec = store.catalog.record(w.cat, ckpt_id)
        if rec is None or rec.is_tombstone or rec.namespace != ns:
            return set()
        rec.promoted_at = now
        store.catalog.put_record(w.cat, rec)
        return distinct_chunks(store.catalog.manifest(w.cat, ckpt_id))

    chunks = store.writer.run(note)
    with store.env.read() as txn:
        packed = [c for c in chunks if (m := store.blocks.meta(txn, c)) and m.seq == PACKED]
    report = promote(vault, sorted(packed))
    return {"checkpoint": ckpt_id, **_summary(report), "retiered": retier(vault, [ckpt_id])}


def tier_of(vault: Vault, txn: Any, chunks: set[bytes]) -> str:
    places = set()
    for cid in chunks:
        meta = vault.store.blocks.meta(txn, cid)
        if meta is None or meta.seq != PACKED:
            places.add("hot")
        else:
            where = vault.store.blocks.location(txn, cid)
            places.add(where.tier if where else "hot")
    if not places:
        return "hot"
    return places.pop() if len(places) == 1 else "mixed"


def retier(vault: Vault, only: list[str] | None = None) -> list[str]:
    """Recompute every live checkpoint's `tier` (or only those given); write the ones that
    changed."""
    store = vault.store
    changes: dict[str, str] = {}
    with store.env.read() as txn:
        listed = (
            [(i, store.catalog.manifest(txn, i)) for i in only]
            if only is not None
            else store.catalog.all_manifests(txn)
        )
        for ckpt_id, files in listed:
            rec = store.catalog.record(txn, ckpt_id)
            if rec is None or rec.is_tombstone:
                continue
            tier = tier_of(vault, txn, distinct_chunks(files))
            if tier != rec.tier:
                changes[ckpt_id] = tier
    if not changes:
        return []

    def op(w: WriteTxn) -> list[str]:
        done = []
        for ckpt_id, tier in changes.items():
            rec = store.catalog.record(w.cat, ckpt_id)
            if rec is not None and not rec.is_tombstone:
                rec.tier = tier
                store.catalog.put_record(w.cat, rec)
                done.append(ckpt_id)
        return done

    return store.writer.run(op)
