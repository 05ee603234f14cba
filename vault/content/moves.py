"""Moving chunks between locations: copy, verify, switch if unchanged, then delete.

1. Copy: frames are read through the one read path (vault/content/reader.py), each
   re-verified against its chunk id (a damaged chunk is never carried into another tier),
   sealed when a keyring is configured, and packed.
2. Verify: the pack is uploaded (conditional create) and its stored size checked, then its
   index is written (vault/content/packs.py).
3. Switch: one writer transaction points every chunk of the pack at its byte range, but only
   chunks still where step 1 found them (anything collected, healed or moved since is left
   as it is; its bytes in the new pack are simply dead).
4. Delete: a later writer transaction drops the hot frames left behind; packs nothing names
   any more are deleted by `delete_unreferenced_pack`, index first.

A SIGKILL between 2 and 3 leaves a pack nothing points to (dead space in the tier, which
repacking deletes); between 3 and 4, hot frames nothing points to (`check --repair` drops
them). Never a pointer to nothing.

Promotion is the same in reverse, in one step: read the range, verify, then one writer
transaction writes the hot frame and switches the pointer, if the chunk is still where it
was read from. The pack keeps its copy as dead bytes until repacking.

Which chunks move, and when, is policy (tiering/); this module only moves what it is told.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..errors import InvalidRequest
from ..frame import seal_frame
from ..pacing import Pacer
from ..writer import WriteTxn
from .chunks import FLAG_DAMAGED
from .location import Location, Packed
from .packs import PACK_PREFIX, PACK_TARGET, PackBuilder, delete_pack, pack_key, upload
from .parts import ContentParts
from .reader import Reader
from .shared import SharedIndex

READ_BATCH = 256
REPLICA_WAIT = 30.0  # seconds a pack deletion waits for the replica to pass its switch


@dataclass
class MoveReport:
    chunks_moved: int = 0
    bytes_moved: int = 0
    packs: int = 0
    skipped: int = 0
    deduplicated: int = 0  # hot chunks pointed at a copy another node shipped (shared tier)
    seconds: float = 0.0
    checkpoints_retiered: list[str] = field(default_factory=list)

    @property
    def mb_per_s(self) -> float:
        return self.bytes_moved / self.seconds / 1e6 if self.seconds else 0.0


@dataclass
class PackUsage:
    """A pack object and the chunks the catalog places in it."""

    tier: str
    key: str
    size: int  # bytes of the object
    live: dict[bytes, Packed]  # chunk -> its place in this pack

    @property
    def live_bytes(self) -> int:
        return sum(w.length for w in self.live.values())

    @property
    def pack_id(self) -> str:
        return self.key[len(PACK_PREFIX) :]


class Mover:
    def __init__(self, store: ContentParts, reader: Reader) -> None:
        self._s = store
        self._reader = reader

    def demote(
        self,
        tier_name: str,
        chunks: Iterable[bytes],
        pack_target: int = PACK_TARGET,
        stop: threading.Event | None = None,
        *,
        local: bool = False,
    ) -> MoveReport:
        """Move the given hot chunks into packs in `tier_name`. `stop` set (SIGTERM): stop
        before the next batch (`MaintenanceStopped`); every pack shipped so far is
        switched, the one being filled is dropped unseen. `local`: the switches are
        acknowledged once durable here, not waiting for a sync replica (a part's shipping,
        vault/parts.py: what the owner adopts is the shared index's copy)."""
        if tier_name not in self._s.tiers:
            raise InvalidRequest(f"tier {tier_name!r} is not configured")
        todo: list[tuple[bytes, Packed | None]] = [(cid, None) for cid in chunks]
        pacer = Pacer("demotion", None, stop)
        return self._pack(tier_name, todo, pack_target, True, pacer, local=local)

    def move_packed(
        self,
        tier_name: str,
        todo: Sequence[tuple[bytes, Packed]],
        pack_target: int = PACK_TARGET,
        stop: threading.Event | None = None,
    ) -> MoveReport:
        """Copy packed chunks (each with where the caller saw it) into new packs in
        `tier_name` and switch each one still there: repacking within a tier, or moving
        chunks on to a colder one. The packs they leave are repacked or deleted later.
        `stop` as for `demote`."""
        pacer = Pacer("repack", None, stop)
        return self._pack(tier_name, list(todo), pack_target, False, pacer)

    def _pack(
        self,
        tier_name: str,
        todo: list[tuple[bytes, Packed | None]],
        pack_target: int,
        from_hot: bool,
        pacer: Pacer,
        *,
        local: bool = False,
    ) -> MoveReport:
        report = MoveReport()
        started = time.monotonic()
        keyring = self._s.keyring
        shared = self._s.shared
        if shared is not None and shared.tier_name != tier_name:
            shared = None
        if shared is not None and from_hot:
            shared.refresh()  # one list a run: what others shipped a moment ago is reused
        pack = self._builder(pack_target, shared)
        sources: dict[bytes, Location] = {}  # chunk -> where it was when copied
        listed: dict[bytes, tuple[int, int]] = {}  # chunk -> (size, flags) for the index
        for i in range(0, len(todo), READ_BATCH):
            pacer.check()
            batch = todo[i : i + READ_BATCH]
            if shared is not None and from_hot:
                batch = self._reuse(shared, batch, report, local)
            cids = [cid for cid, _ in batch]
            metas, frames = self._reader.frames(cids)
            sound, _ = self._reader.decoded(cids, metas, frames)
            for (cid, seen), meta, frame, plain in zip(batch, metas, frames, sound, strict=True):
                if meta is None or frame is None or meta.damaged or meta.where is None:
                    report.skipped += 1
                    continue
                if meta.hot != from_hot or (seen is not None and meta.where != seen):
                    report.skipped += 1  # moved since the caller looked
                    continue
                if plain is None:
                    report.skipped += 1  # scrub will flag it; it must not travel
                    continue
                pack.add(cid, seal_frame(keyring, frame, cid) if keyring is not None else frame)
                sources[cid] = meta.where
                if not meta.delta:  # a delta needs its base in the same catalog
                    listed[cid] = (meta.size, meta.flags & ~FLAG_DAMAGED)
                if pack.full:
                    self._ship(tier_name, pack, sources, report, listed, local)
                    pack, sources, listed = self._builder(pack_target, shared), {}, {}
        if pack.entries:
            self._ship(tier_name, pack, sources, report, listed, local)
        report.seconds = time.monotonic() - started
        return report

    @staticmethod
    def _builder(target: int, shared: SharedIndex | None) -> PackBuilder:
        return PackBuilder(target) if shared is None else PackBuilder(target, shared.new_pack_id())

    def _reuse(
        self,
        shared: SharedIndex,
        batch: list[tuple[bytes, Packed | None]],
        report: MoveReport,
        local: bool = False,
    ) -> list[tuple[bytes, Packed | None]]:
        """Point hot chunks another node already shipped at its copy instead of packing
        them again; returns the rest of the batch. Same order as a move: the switch only
        for chunks still hot where they were, the hot frames dropped after it commits."""
        known = shared.lookup(cid for cid, _ in batch)
        if not known:
            return batch
        chunks = self._s.chunks

        def switch(w: WriteTxn) -> dict[bytes, Location]:
            left: dict[bytes, Location] = {}
            for cid, entry in known.items():
                meta = chunks.meta(w.catalog, cid)
                if meta is None or not meta.hot or meta.where is None:
                    continue  # gone or moved since: the pass below skips it as before
                if meta.flags != entry.flags or meta.size != entry.size:
                    continue  # damaged, or encoded otherwise here: packed as usual
                if not shared.takeable(entry.where.key):
                    continue  # condemned since the lookup (sharedgc.py): packed as usual
                left[cid] = meta.where
                chunks.move(w, cid, meta, entry.where)
            return left

        left = self._s.writer.run(switch, size=len(known) * 64, local=local)
        if left:
            frames = list(left.values())
            self._s.writer.run(lambda w: chunks.drop_hot_frames(w.frames, frames), local=local)
        report.chunks_moved += len(left)
        report.deduplicated += len(left)
        return [(cid, seen) for cid, seen in batch if cid not in left]

    def _ship(
        self,
        tier_name: str,
        pack: PackBuilder,
        sources: dict[bytes, Location],
        report: MoveReport,
        listed: dict[bytes, tuple[int, int]],
        local: bool = False,
    ) -> None:
        upload(self._s.tiers[tier_name], pack, self._s.keyring)
        key = pack_key(pack.pack_id)
        chunks = self._s.chunks
        shared = self._s.shared
        if shared is not None and shared.tier_name == tier_name:
            # after the pack is whole, before any pointer names it (shared.py, invariant 1)
            rows = [
                (e.chunk, e.offset, e.length, *listed[e.chunk])
                for e in pack.entries
                if e.chunk in listed
            ]
            shared.publish(key, rows)
            if shared.gate is not None:
                shared.gate.ready()  # a view fresh enough for the check in the switch
        mine = shared if shared is not None and shared.tier_name == tier_name else None

        def switch(w: WriteTxn) -> list[Location]:
            left: list[Location] = []
            if mine is not None and not mine.takeable(key):
                return left  # condemned (sharedgc.py): the chunks stay, the pack is dead
            for entry in pack.entries:
                meta = chunks.meta(w.catalog, entry.chunk)
                if meta is None or meta.damaged or meta.where != sources[entry.chunk]:
                    continue  # collected, healed or moved since it was copied
                place = Packed(tier_name, key, entry.offset, entry.length)
                chunks.move(w, entry.chunk, meta, place)
                left.append(sources[entry.chunk])
            return left

        left = self._s.writer.run(switch, size=len(pack.entries) * 64, local=local)
        if any(not isinstance(w, Packed) for w in left):
            self._s.writer.run(lambda w: chunks.drop_hot_frames(w.frames, left), local=local)
        report.packs += 1
        report.chunks_moved += len(left)
        report.bytes_moved += pack.size

    def promote(self, chunks: Iterable[bytes], stop: threading.Event | None = None) -> MoveReport:
        """Bring the given packed chunks back into the hot store; `stop` as for `demote`
        (each batch is switched in its own commit)."""
        report = MoveReport()
        started = time.monotonic()
        table = self._s.chunks
        todo = list(chunks)
        pacer = Pacer("promotion", None, stop)
        for i in range(0, len(todo), READ_BATCH):
            pacer.check()
            batch = todo[i : i + READ_BATCH]
            metas, frames = self._reader.frames(batch)
            sound, _ = self._reader.decoded(batch, metas, frames)
            ready: dict[bytes, tuple[Location, bytes]] = {}
            for cid, meta, frame, plain in zip(batch, metas, frames, sound, strict=True):
                if frame is None or plain is None or meta is None:
                    report.skipped += 1
                    continue
                if not isinstance(meta.where, Packed):
                    report.skipped += 1
                    continue
                ready[cid] = (meta.where, frame)

            def switch(w: WriteTxn, ready: dict[bytes, tuple[Location, bytes]] = ready) -> int:
                moved = 0
                for cid, (where, frame) in ready.items():
                    meta = table.meta(w.catalog, cid)
                    if meta is None or meta.where != where:
                        continue  # collected, healed or moved since it was read
                    table.move_hot(w, cid, meta, frame)
                    moved += 1
                return moved

            size = sum(len(f) for _, f in ready.values())
            report.chunks_moved += self._s.writer.run(switch, size=size)
            report.bytes_moved += size
        report.seconds = time.monotonic() - started
        return report

    @property
    def shared_tier(self) -> str | None:
        """The cluster's shared tier (vault/content/shared.py), if any: never repacked."""
        shared = self._s.shared
        return shared.tier_name if shared is not None else None

    def pack_usage(self) -> list[PackUsage]:
        """Every pack in every tier with the chunks the catalog places in it; in a shared
        tier, only the packs this process wrote."""
        live: dict[tuple[str, str], dict[bytes, Packed]] = defaultdict(dict)
        with self._s.catalog_env.read() as txn:
            for cid, where in self._s.chunks.packed_locations(txn):
                live[(where.tier, where.key)][cid] = where
        out = []
        shared = self._s.shared
        for name, tier in self._s.tiers.items():
            for key in tier.list(PACK_PREFIX):
                if key.endswith(".idx"):
                    continue
                if shared is not None and name == shared.tier_name and not shared.owns(key):
                    continue  # another writer's: never this process's to rewrite or delete
                size = tier.head(key) or 0
                out.append(PackUsage(name, key, size, live.get((name, key), {})))
        return out

    def delete_unreferenced_pack(self, usage: PackUsage) -> bool:
        """Delete a pack (index first) if nothing in the catalog points at it any more;
        callers hold the maintenance lock, so no move is between its upload and switch.
        In the shared tier, only a pack this process wrote and no index segment lists:
        another node may name any listed chunk, or be between its upload and its publish
        (vault/content/shared.py, invariants 2 and 3)."""
        shared = self._s.shared
        if (
            shared is not None
            and shared.tier_name == usage.tier
            and (not shared.owns(usage.key) or shared.lists(usage.key))
        ):
            return False
        with self._s.catalog_env.read() as txn:
            for cid in usage.live:
                meta = self._s.chunks.meta(txn, cid)
                where = meta.where if meta is not None else None
                if isinstance(where, Packed) and (where.tier, where.key) == (
                    usage.tier,
                    usage.key,
                ):
                    return False
        self._s.writer.wait_durable()  # what the read saw must not be undone by a crash
        barrier = self._s.replica_barrier
        if barrier is not None and not barrier(REPLICA_WAIT):
            return False  # the replica may still name it: next round
        delete_pack(self._s.tiers[usage.tier], usage.pack_id)
        return True
