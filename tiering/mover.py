"""Moving chunks out of the hot tier into packs: copy, verify, switch, then delete.

1. Copy: frames are read from the hot store, each re-verified against its chunk id (a
   damaged chunk is never carried into a cold tier), and packed.
2. Verify: the pack is uploaded (conditional create) and its stored size checked, then its
   index is written.
3. Switch: one writer transaction points every chunk of the pack at its byte range, but only
   chunks still hot and unchanged since step 1 (anything collected, healed or moved since is
   left as it is; its bytes in the pack are simply dead).
4. Delete: a later writer transaction drops the hot frames.

A SIGKILL between 2 and 3 leaves a pack nothing points to (dead space in the tier, which
repacking deletes); between 3 and 4, hot frames nothing points to (`check --repair` drops
them). Never a pointer to nothing.

Promotion is the same in reverse, in one step: read the range, verify, then one writer
transaction writes the hot frame and switches the pointer, if the chunk is still where it
was read from. The pack keeps its copy as dead bytes until repacking.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from vault import BlockCorrupt, Vault
from vault.blocks import INLINE, PACKED, Location
from vault.errors import InvalidRequest
from vault.frame import Decoder, seal_frame
from vault.writer import WriteTxn

from .packs import PACK_TARGET, PackBuilder, pack_key, upload

READ_BATCH = 256


@dataclass
class MoveReport:
    chunks_moved: int = 0
    bytes_moved: int = 0
    packs: int = 0
    skipped: int = 0
    seconds: float = 0.0
    checkpoints_retiered: list[str] = field(default_factory=list)

    @property
    def mb_per_s(self) -> float:
        return self.bytes_moved / self.seconds / 1e6 if self.seconds else 0.0


def demote(
    vault: Vault, tier_name: str, chunks: Iterable[bytes], pack_target: int = PACK_TARGET
) -> MoveReport:
    """Move the given hot chunks into packs in `tier_name`."""
    report = MoveReport()
    started = time.monotonic()
    if tier_name not in vault.store.tiers:
        raise InvalidRequest(f"tier {tier_name!r} is not configured")
    decoder = Decoder()
    keyring = vault.store.keyring
    pack = PackBuilder(pack_target)
    sources: dict[bytes, int] = {}  # chunk -> the seq it had when copied
    todo = list(chunks)
    for i in range(0, len(todo), READ_BATCH):
        batch = todo[i : i + READ_BATCH]
        metas, frames = vault.reader.frames(batch)
        for cid, meta, frame in zip(batch, metas, frames, strict=True):
            if meta is None or frame is None or meta.seq == PACKED or meta.damaged:
                report.skipped += 1
                continue
            try:
                decoder.plaintext(frame, cid)
            except BlockCorrupt:
                report.skipped += 1  # scrub will flag it; it must not travel
                continue
            sealed = seal_frame(keyring, frame, cid) if keyring is not None else frame
            pack.add(cid, sealed)
            sources[cid] = meta.seq
            if pack.full:
                _ship(vault, tier_name, pack, sources, report)
                pack, sources = PackBuilder(pack_target), {}
    if pack.entries:
        _ship(vault, tier_name, pack, sources, report)
    report.seconds = time.monotonic() - started
    return report


def promote(vault: Vault, chunks: Iterable[bytes]) -> MoveReport:
    """Bring the given packed chunks back into the hot store."""
    report = MoveReport()
    started = time.monotonic()
    decoder = Decoder()
    blocks = vault.store.blocks
    todo = list(chunks)
    for i in range(0, len(todo), READ_BATCH):
        batch = todo[i : i + READ_BATCH]
        metas, frames = vault.reader.frames(batch)
        ready: dict[bytes, tuple[Location | None, bytes]] = {}
        with vault.store.env.read() as txn:
            for cid, meta, frame in zip(batch, metas, frames, strict=True):
                if meta is None or frame is None or meta.seq != PACKED:
                    report.skipped += 1
                    continue
                try:
                    decoder.plaintext(frame, cid)
                except BlockCorrupt:
                    report.skipped += 1
                    continue
                ready[cid] = (blocks.location(txn, cid), frame)

        def switch(w: WriteTxn, ready: dict[bytes, tuple[Location | None, bytes]] = ready) -> int:
            moved = 0
            for cid, (where, frame) in ready.items():
                meta = blocks.meta(w.cat, cid)
                if meta is None or meta.seq != PACKED or blocks.location(w.cat, cid) != where:
                    continue  # collected, healed or moved since it was read
                blocks.move_to_hot(w, cid, meta, frame)
                moved += 1
            return moved

        report.chunks_moved += vault.store.writer.run(
            switch, size=sum(len(f) for _, f in ready.values())
        )
        report.bytes_moved += sum(len(f) for _, f in ready.values())
    report.seconds = time.monotonic() - started
    return report


def _ship(
    vault: Vault, tier_name: str, pack: PackBuilder, sources: dict[bytes, int], report: MoveReport
) -> None:
    upload(vault.store.tiers[tier_name], pack, vault.store.keyring)
    key = pack_key(pack.pack_id)
    blocks = vault.store.blocks

    def switch(w: WriteTxn) -> list[int]:
        freed = []
        for entry in pack.entries:
            meta = blocks.meta(w.cat, entry.chunk)
            if meta is None or meta.damaged or meta.seq != sources[entry.chunk]:
                continue
            blocks.move_to_pack(
                w.cat, entry.chunk, meta, Location(tier_name, key, entry.offset, entry.length)
            )
            freed.append(meta.seq)
        return freed

    freed = vault.store.writer.run(switch, size=len(pack.entries) * 64)
    frame_seqs = [s for s in freed if s not in (INLINE, PACKED)]
    if frame_seqs:
        vault.store.writer.run(lambda w: blocks.drop_frames(w.data, frame_seqs))
    report.packs += 1
    report.chunks_moved += len(freed)
    report.bytes_moved += pack.size
