"""Repacking: GC, promotion and healing leave dead bytes in packs (a pack is never
rewritten in place); packs whose live fraction falls under a threshold get their live
frames copied into new packs, and packs nothing points to are deleted.

This module decides which packs to rewrite (policy); the engine's content layer
(vault/content/moves.py) does the moving: read and verify the live frames, upload the new
pack (sealed with the active key, so repacking also finishes a key rotation), switch each
chunk that still points at its old place in one writer transaction, and only then delete
old packs that nothing points to any more. A SIGKILL before the switch leaves an
unreferenced new pack, after it an unreferenced old one; either is deleted by the next run.
A reader that looked a chunk up just before the switch and finds the old pack gone looks it
up again (vault/content/reader.py).

`repack` and `move_packed` run under the vault's maintenance lock (vault/maintenance.py),
which their caller holds (`maintenance.run` around the gc and tiering tasks), so no demotion
is between its upload and its switch while unreferenced packs are deleted; a tier prefix
must belong to one vault.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass

from checkpoint_vault.vault import Vault
from checkpoint_vault.vault.content import PACK_TARGET, Packed, PackUsage

DEFAULT_REPACK_BELOW = 0.5


def sparse(p: PackUsage, below: float) -> bool:
    """Worth rewriting: live fraction under `below`; 1 means every pack (re-sealing
    everything under a new key), and a pack nothing points to always goes."""
    return not p.live or below >= 1.0 or p.live_bytes < below * p.size


@dataclass
class RepackReport:
    packs: int = 0  # packs in the tiers
    rewritten: int = 0
    deleted: int = 0
    new_packs: int = 0
    chunks_moved: int = 0
    bytes_deleted: int = 0  # size of the packs deleted
    bytes_written: int = 0  # size of the new packs (their live bytes)
    seconds: float = 0.0

    @property
    def dead_bytes_freed(self) -> int:
        return self.bytes_deleted - self.bytes_written

    def to_wire(self) -> dict[str, object]:
        return {
            "packs": self.packs,
            "rewritten": self.rewritten,
            "deleted": self.deleted,
            "new_packs": self.new_packs,
            "chunks_moved": self.chunks_moved,
            "dead_bytes_freed": self.dead_bytes_freed,
            "seconds": round(self.seconds, 3),
        }


def plan(vault: Vault, below: float = DEFAULT_REPACK_BELOW) -> list[PackUsage]:
    """Packs to rewrite or delete: live fraction under `below` (0 live: just delete)."""
    return [p for p in vault.content.pack_usage() if sparse(p, below)]


def repack(
    vault: Vault,
    below: float = DEFAULT_REPACK_BELOW,
    pack_target: int = PACK_TARGET,
    stop: threading.Event | None = None,
) -> RepackReport:
    """Rewrite the sparse packs' live chunks into new packs, then delete the packs nothing
    is left in. `stop` set: stop before the next batch (`MaintenanceStopped`); an old pack
    whose chunks did not all move is kept, so a stop loses nothing."""
    started = time.monotonic()
    report = RepackReport()
    packs = vault.content.pack_usage()
    report.packs = len(packs)
    by_tier: dict[str, list[PackUsage]] = defaultdict(list)
    for p in packs:
        if sparse(p, below):
            by_tier[p.tier].append(p)
    for tier_name, group in by_tier.items():
        live = [item for p in group if p.live for item in sorted(p.live.items(), key=_offset)]
        if tier_name == vault.content.shared_tier:
            live = []  # other nodes may name any frame: a copy would only store it twice
        move_packed(vault, tier_name, live, pack_target, report, stop)
        for p in group:
            if vault.content.delete_unreferenced_pack(p):
                report.deleted += 1
                report.bytes_deleted += p.size
        report.rewritten += sum(1 for p in group if p.live)
    report.seconds = time.monotonic() - started
    return report


def move_packed(
    vault: Vault,
    tier_name: str,
    todo: list[tuple[bytes, Packed]],
    target: int = PACK_TARGET,
    report: RepackReport | None = None,
    stop: threading.Event | None = None,
) -> RepackReport:
    """Copy packed chunks (each with where the caller saw it) into new packs in
    `tier_name` and switch each one still there: repacking within a tier, or moving chunks
    to a colder one. The packs they leave are repacked or deleted later, like any other.
    `stop` set: stop before the next batch (`MaintenanceStopped`)."""
    report = report if report is not None else RepackReport()
    moved = vault.content.move_packed(tier_name, todo, target, stop)
    report.chunks_moved += moved.chunks_moved
    report.new_packs += moved.packs
    report.bytes_written += moved.bytes_moved
    return report


def _offset(item: tuple[bytes, Packed]) -> int:
    return item[1].offset
