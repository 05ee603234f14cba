"""Which chunks should leave the hot tier: a pure plan over the catalog, like retention.

Per namespace (its policy's `tiering` object):
- `target`: the tier to demote to (no target: nothing moves);
- `demote_after`: only checkpoints older than this (duration, e.g. `7d`);
- `keep_hot_last`: the newest N checkpoints always stay hot;
- `pinned_stay_hot`: pinned checkpoints stay hot (default true).
A chunk used by any checkpoint that stays hot stays hot, whatever other checkpoints share it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vault import Vault
from vault.blocks import PACKED
from vault.errors import InvalidRequest
from vault.manifest import distinct_chunks
from vault.policy import parse_duration
from vault.prune import live_records


@dataclass
class TieringPlan:
    moves: dict[str, set[bytes]] = field(default_factory=dict)  # target tier -> chunks
    bytes: dict[str, int] = field(default_factory=dict)
    checkpoints: dict[str, list[str]] = field(default_factory=dict)  # target -> ids

    def to_wire(self) -> dict[str, object]:
        return {
            "tiers": {
                t: {
                    "chunks": len(c),
                    "bytes": self.bytes.get(t, 0),
                    "checkpoints": self.checkpoints.get(t, []),
                }
                for t, c in self.moves.items()
            }
        }


def plan(vault: Vault, now: float) -> TieringPlan:
    out = TieringPlan()
    hot: set[bytes] = set()
    store = vault.store
    with store.env.read() as txn:
        for ns in [n.name for n in store.catalog.namespaces(txn)]:
            settings = vault.policy_for(txn, ns).tiering
            target = settings.get("target")
            if target is not None and not isinstance(target, str):
                raise InvalidRequest(f"namespace {ns}: tiering target must be a tier name")
            if target is not None and target not in store.tiers:
                raise InvalidRequest(f"namespace {ns}: tier {target!r} is not configured")
            after = parse_duration(settings.get("demote_after", 0), "demote_after")
            keep = int(settings.get("keep_hot_last", 1))
            pinned_hot = bool(settings.get("pinned_stay_hot", True))
            for i, rec in enumerate(live_records(store, txn, ns)):
                chunks = distinct_chunks(store.catalog.manifest(txn, rec.id))
                cold = (
                    i >= keep and rec.created_at <= now - after and not (rec.pinned and pinned_hot)
                )
                if target is not None and cold:
                    out.moves.setdefault(target, set()).update(chunks)
                    out.checkpoints.setdefault(target, []).append(rec.id)
                else:
                    hot |= chunks
        for target, chunks in out.moves.items():
            keep_moving = set()
            for cid in chunks - hot:
                meta = store.blocks.meta(txn, cid)
                if meta is not None and meta.seq != PACKED and not meta.damaged:
                    keep_moving.add(cid)
                    out.bytes[target] = out.bytes.get(target, 0) + meta.stored
            out.moves[target] = keep_moving
    return out
