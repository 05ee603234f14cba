"""Repacking: GC, promotion and healing leave dead bytes in packs (a pack is never
rewritten in place); packs whose live fraction falls under a threshold get their live
frames copied into new packs, and packs nothing points to are deleted.

The steps are the mover's: read and verify the live frames, upload the new pack (sealed
with the active key, so repacking also finishes a key rotation), switch each chunk that
still points at its old place in one writer transaction, and only then delete old packs
that nothing points to any more. A SIGKILL before the switch leaves an unreferenced new
pack, after it an unreferenced old one; either is deleted by the next run. A reader that
looked a chunk up just before the switch and finds the old pack gone looks it up again
(vault/reader.py).

`repack` and `move_packed` hold the vault's maintenance lock (vault/maintenance.py)
themselves, whoever calls them, so no demotion is between its upload and its switch while
unreferenced packs are deleted; a tier prefix must belong to one vault.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

from vault import BlockCorrupt, Vault
from vault.blocks import PACKED, Location
from vault.frame import Decoder, seal_frame
from vault.maintenance import maintenance_operation
from vault.writer import WriteTxn

from .packs import PACK_TARGET, PackBuilder, delete_pack, pack_key, upload

PACK_PREFIX = "packs/"
DEFAULT_REPACK_BELOW = 0.5
READ_BATCH = 256


@dataclass
class PackUsage:
    tier: str
    key: str
    size: int  # bytes of the object
    live: dict[bytes, Location]  # chunk -> where the catalog says it is in this pack

    @property
    def live_bytes(self) -> int:
        return sum(w.length for w in self.live.values())

    @property
    def pack_id(self) -> str:
        return self.key[len(PACK_PREFIX) :]

    def sparse(self, below: float) -> bool:
        """Worth rewriting: live fraction under `below`; 1 means every pack (re-sealing
        everything under a new key), and a pack nothing points to always goes."""
        return not self.live or below >= 1.0 or self.live_bytes < below * self.size


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


def usage(vault: Vault) -> list[PackUsage]:
    """Every pack in every tier with the chunks the catalog places in it."""
    live: dict[tuple[str, str], dict[bytes, Location]] = defaultdict(dict)
    for cid, raw in vault.store.env.scan("packed"):
        where = Location.unpack(raw)
        live[(where.tier, where.key)][bytes(cid)] = where
    out = []
    for name, tier in vault.store.tiers.items():
        for key in tier.list(PACK_PREFIX):
            if key.endswith(".idx"):
                continue
            size = tier.head(key) or 0
            out.append(PackUsage(name, key, size, live.get((name, key), {})))
    return out


def plan(vault: Vault, below: float = DEFAULT_REPACK_BELOW) -> list[PackUsage]:
    """Packs to rewrite or delete: live fraction under `below` (0 live: just delete)."""
    return [p for p in usage(vault) if p.sparse(below)]


@maintenance_operation("repack")
def repack(
    vault: Vault, below: float = DEFAULT_REPACK_BELOW, pack_target: int = PACK_TARGET
) -> RepackReport:
    started = time.monotonic()
    report = RepackReport()
    packs = usage(vault)
    report.packs = len(packs)
    sparse = [p for p in packs if p.sparse(below)]
    by_tier: dict[str, list[PackUsage]] = defaultdict(list)
    for p in sparse:
        by_tier[p.tier].append(p)
    for tier_name, group in by_tier.items():
        live = [item for p in group if p.live for item in sorted(p.live.items(), key=_offset)]
        move_packed(vault, tier_name, live, pack_target, report)
        for p in group:
            if _unreferenced(vault, p):
                delete_pack(vault.store.tiers[tier_name], p.pack_id)
                report.deleted += 1
                report.bytes_deleted += p.size
        report.rewritten += sum(1 for p in group if p.live)
    report.seconds = time.monotonic() - started
    return report


@maintenance_operation("repack")
def move_packed(
    vault: Vault,
    tier_name: str,
    todo: list[tuple[bytes, Location]],
    target: int = PACK_TARGET,
    report: RepackReport | None = None,
) -> RepackReport:
    """Copy packed chunks (each with where the caller saw it) into new packs in
    `tier_name` and switch each one still there: repacking within a tier, or moving chunks
    to a colder one. The packs they leave are repacked or deleted later, like any other."""
    report = report if report is not None else RepackReport()
    decoder = Decoder()
    keyring = vault.store.keyring
    pack = PackBuilder(target)
    sources: dict[bytes, Location] = {}
    for i in range(0, len(todo), READ_BATCH):
        batch = todo[i : i + READ_BATCH]
        metas, frames = vault.reader.frames([cid for cid, _ in batch])
        for (cid, where), meta, frame in zip(batch, metas, frames, strict=True):
            if meta is None or frame is None or meta.seq != PACKED or meta.damaged:
                continue  # moved, collected or damaged since: left where it is
            try:
                decoder.plaintext(frame, cid)
            except BlockCorrupt:
                continue  # scrub flags it; its pack stays until it heals
            pack.add(cid, seal_frame(keyring, frame, cid) if keyring is not None else frame)
            sources[cid] = where
            if pack.full:
                _ship(vault, tier_name, pack, sources, report)
                pack, sources = PackBuilder(target), {}
    if pack.entries:
        _ship(vault, tier_name, pack, sources, report)
    return report


def _offset(item: tuple[bytes, Location]) -> int:
    return item[1].offset


def _ship(
    vault: Vault,
    tier_name: str,
    pack: PackBuilder,
    sources: dict[bytes, Location],
    report: RepackReport,
) -> None:
    upload(vault.store.tiers[tier_name], pack, vault.store.keyring)
    key = pack_key(pack.pack_id)
    blocks = vault.store.blocks

    def switch(w: WriteTxn) -> int:
        moved = 0
        for entry in pack.entries:
            meta = blocks.meta(w.cat, entry.chunk)
            if meta is None or blocks.location(w.cat, entry.chunk) != sources[entry.chunk]:
                continue
            new = Location(tier_name, key, entry.offset, entry.length)
            blocks.relocate(w.cat, entry.chunk, meta, sources[entry.chunk], new)
            moved += 1
        return moved

    report.chunks_moved += vault.store.writer.run(switch, size=len(pack.entries) * 64)
    report.new_packs += 1
    report.bytes_written += pack.size


def _unreferenced(vault: Vault, p: PackUsage) -> bool:
    """Nothing in the catalog points at the pack any more (checked after the switches)."""
    blocks = vault.store.blocks
    with vault.store.env.read() as txn:
        for cid in p.live:
            where = blocks.location(txn, cid)
            if where is not None and (where.tier, where.key) == (p.tier, p.key):
                return False
    return True
