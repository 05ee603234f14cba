"""One tiering run: plan, move each target's chunks, then say on each checkpoint record
where its bytes now are (`tier`: hot, a tier's name, or mixed)."""

from __future__ import annotations

from typing import Any

from vault import Vault
from vault.blocks import PACKED
from vault.manifest import distinct_chunks
from vault.writer import WriteTxn

from .mover import demote
from .policy import plan


def run_tiering(vault: Vault, dry_run: bool = False) -> dict[str, Any]:
    tiering_plan = plan(vault, vault.store.clock.now())
    out: dict[str, Any] = {"dry_run": dry_run, **tiering_plan.to_wire()}
    if dry_run:
        return out
    moved = {}
    for target, chunks in tiering_plan.moves.items():
        if chunks:
            report = demote(vault, target, sorted(chunks))
            moved[target] = {
                "chunks": report.chunks_moved,
                "bytes": report.bytes_moved,
                "packs": report.packs,
                "skipped": report.skipped,
                "seconds": round(report.seconds, 3),
                "mb_per_s": round(report.mb_per_s, 1),
            }
    out["moved"] = moved
    out["retiered"] = retier(vault)
    return out


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


def retier(vault: Vault) -> list[str]:
    """Recompute every live checkpoint's `tier`; write the ones that changed."""
    store = vault.store
    changes: dict[str, str] = {}
    with store.env.read() as txn:
        for ckpt_id, files in store.catalog.all_manifests(txn):
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
