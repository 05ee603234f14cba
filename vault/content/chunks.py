"""Chunk metadata and where each chunk's frame lives, and every change of place.

A chunk's metadata carries its reference count (live file entries listing it, and live
checkpoints of older catalogs whose manifests list it whole: vault/entries.py), when that
count last reached zero (the GC grace period runs from there), until when a live upload
has reserved it, whether it was found damaged, and its `Location`
(vault/content/location.py). Hot frames are keyed by an increasing sequence number (big
endian, so appends go to the end of the B-tree); a frame is never rewritten in place:
healing a damaged chunk writes a new frame under a new number and points the metadata at it.

Every switch of a chunk's location (to a pack, to another pack, back hot, healed, recoded,
forgotten) is a method here, so the tables behind a location (frames, `inline`, `packed`),
the delta links (`deltas`, `bases`) and the per-tier and per-codec counters change together
in the caller's writer transaction.

A chunk recoded as a delta names a base chunk: `deltas` maps it to its base, `bases` lists a
base's dependents. A base with dependents is never collected, whatever its reference count
(GC asks `has_dependents`), and a damaged base makes every chunk that depends on it
unreadable, so flagging one flags them all (`mark_damaged`); healing a delta (a re-upload
of its bytes) stores it whole and drops its link.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import lmdb

from ..counters import Counters
from ..env import Env
from ..frame import CODEC_DELTA, CODEC_GROUPED, Encoder, delta_base, frame_codec
from ..writer import WriteTxn
from .location import HotFrame, Inline, Location, Packed

_META = struct.Struct("<QIIqqBQ")
# Hot paths touch single fields in place (every commit adjusts one count per chunk).
_REFS = struct.Struct("<Q")  # at offset 0
_ZERO_SINCE = struct.Struct("<q")  # at offset 16
_FLAGS_AT = 32
_SEQ = struct.Struct(">Q")
_SEQ_PACKED = (1 << 64) - 1  # the on-disk u64 of a Packed location (details in `packed`)
_INLINE_BIT = 1 << 63  # on disk, an Inline location's sequence number carries this bit
# (and 0 is an inline chunk stored before they had numbers, keyed by its id)
SEQ_FLOOR = "frame_seq_floor"  # counter: new frames start at least here (after a restore)
FLAG_DAMAGED = 1
FLAG_GROUPED = 2  # recoded by compaction as a byte-grouped frame
FLAG_DELTA = 4  # recoded by compaction as a delta against a base chunk
_CODEC_FLAGS = FLAG_GROUPED | FLAG_DELTA
ID_LEN = 32


class ChunkMeta(NamedTuple):
    """A NamedTuple, not a dataclass: commits rebuild one per chunk, and `_replace` on a
    tuple costs a tenth of `dataclasses.replace` (measured on agent saves)."""

    refs: int
    size: int  # plaintext bytes
    stored: int  # frame bytes
    zero_since_ms: int  # when refs last became 0 (0 while referenced)
    reserved_until_ms: int  # a live upload may reference it until then
    flags: int
    where: Location | None  # None: packed, but the catalog cannot place it (drift)

    @property
    def damaged(self) -> bool:
        return bool(self.flags & FLAG_DAMAGED)

    @property
    def delta(self) -> bool:
        return bool(self.flags & FLAG_DELTA)

    @property
    def codec(self) -> str:
        """How the frame is encoded: raw or zstd as ingested (told apart by size), or what
        compaction recoded it into."""
        if self.flags & FLAG_DELTA:
            return "delta"
        if self.flags & FLAG_GROUPED:
            return "grouped"
        return "zstd" if self.stored < self.size else "raw"

    @property
    def hot(self) -> bool:
        """Stored on this machine (frame environment or inline), not in another tier."""
        return isinstance(self.where, (HotFrame, Inline))


def seq_key(seq: int) -> bytes:
    return _SEQ.pack(seq)


def _seq_of(key: bytes | memoryview) -> int:
    return int(_SEQ.unpack(key)[0])


def _after_last(txn: lmdb.Transaction, db: lmdb._Database) -> int:
    """The number after the last one keyed in `db` (1 when it is empty)."""
    cur = txn.cursor(db=db)
    return _seq_of(cur.key()) + 1 if cur.last() else 1


def _disk_seq(where: Location | None) -> int:
    if isinstance(where, HotFrame):
        return where.seq
    if isinstance(where, Inline):
        return _INLINE_BIT | where.seq if where.seq else 0
    return _SEQ_PACKED


def _inline_disk_seq(seq: int) -> bool:
    return seq == 0 or (seq != _SEQ_PACKED and bool(seq & _INLINE_BIT))


class Chunks:
    def __init__(self, catalog: Env, frames: Env, counters: Counters) -> None:
        self._catalog = catalog
        self.frames_env = frames
        self._frames = frames.db["frames"]
        self._meta = catalog.db["chunkmeta"]
        self._inline_by_id = catalog.db["inline"]
        self._inline = catalog.db["inline_frames"]
        self._packed = catalog.db["packed"]
        self._deltas = catalog.db["deltas"]
        self._bases = catalog.db["bases"]
        self.counters = counters
        self._next_seq = 1  # writer thread only
        self.reset_sequence()

    def reset_sequence(self) -> None:
        """Number new frames after the last one stored (and the floor a catalog restore
        sets); at open, and when a standby that applied the replica's frames is promoted."""
        with self.frames_env.read() as txn:
            after_frames = _after_last(txn, self._frames)
        with self._catalog.read() as txn:
            floor = self.counters.get(txn, SEQ_FLOOR)
            after_inline = _after_last(txn, self._inline)
        self._next_seq = max(after_frames, after_inline, floor)

    # -- reading ----------------------------------------------------------------------
    def _decode(self, txn: lmdb.Transaction, cid: bytes, raw: bytes | memoryview) -> ChunkMeta:
        refs, size, stored, zero_since, reserved, flags, seq = _META.unpack(raw)
        where: Location | None
        if seq == _SEQ_PACKED:
            row = txn.get(cid, db=self._packed)
            where = Packed.decode(row) if row is not None else None
        elif _inline_disk_seq(seq):
            where = Inline(seq & ~_INLINE_BIT)
        else:
            where = HotFrame(seq)
        return ChunkMeta(refs, size, stored, zero_since, reserved, flags, where)

    def meta(self, txn: lmdb.Transaction, cid: bytes) -> ChunkMeta | None:
        raw = txn.get(cid, db=self._meta)
        return self._decode(txn, cid, raw) if raw is not None else None

    def all(self, txn: lmdb.Transaction) -> Iterator[tuple[bytes, ChunkMeta]]:
        """Every chunk of the catalog snapshot `txn`, in id order."""
        for key, raw in txn.cursor(db=self._meta):
            cid = bytes(key)
            yield cid, self._decode(txn, cid, raw)

    def scan(self, batch: int = 4096) -> Iterator[tuple[bytes, ChunkMeta]]:
        """Every chunk, read in short transactions: not a snapshot (entries written during
        the scan may or may not appear), so callers re-check inside the writer."""
        pending: list[tuple[bytes, bytes]] = []
        for item in self._catalog.scan("chunkmeta"):
            pending.append(item)
            if len(pending) >= batch:
                yield from self._decoded(pending)
                pending = []
        yield from self._decoded(pending)

    def _decoded(self, items: list[tuple[bytes, bytes]]) -> list[tuple[bytes, ChunkMeta]]:
        with self._catalog.read() as txn:
            return [(cid, self._decode(txn, cid, raw)) for cid, raw in items]

    def usable(self, txn: lmdb.Transaction, cid: bytes) -> bool:
        """Stored and not known to be damaged: what dedup and commit may rely on."""
        raw = txn.get(cid, db=self._meta)
        return raw is not None and not raw[_FLAGS_AT] & FLAG_DAMAGED

    def base_of(self, txn: lmdb.Transaction, cid: bytes) -> bytes | None:
        """The base a delta chunk is encoded against (None for a chunk stored whole)."""
        raw = txn.get(cid, db=self._deltas)
        return bytes(raw) if raw is not None else None

    def dependents(self, txn: lmdb.Transaction, base: bytes) -> list[bytes]:
        """The chunks encoded as deltas against `base`."""
        return _suffixes(txn, self._bases, base)

    def delta_links(self, txn: lmdb.Transaction) -> Iterator[tuple[bytes, bytes]]:
        """Every (delta chunk, its base)."""
        for key, raw in txn.cursor(db=self._deltas):
            yield bytes(key), bytes(raw)

    def drop_stale_link(self, txn: lmdb.Transaction, cid: bytes) -> None:
        """Remove the link of a chunk that is no longer stored (check --repair)."""
        if txn.get(cid, db=self._meta) is None:
            self._unlink_base(txn, cid)

    def has_dependents(self, txn: lmdb.Transaction, base: bytes) -> bool:
        cur = txn.cursor(db=self._bases)
        return bool(cur.set_range(base)) and bytes(cur.key()[:ID_LEN]) == base

    def chain(self, txn: lmdb.Transaction, cid: bytes, limit: int) -> list[bytes]:
        """`cid` and the bases its read needs, nearest first (at most `limit` + 1 ids)."""
        out = [cid]
        base = self.base_of(txn, cid)
        while base is not None and len(out) <= limit:
            out.append(base)
            base = self.base_of(txn, base)
        return out

    def dependent_height(self, txn: lmdb.Transaction, cid: bytes, limit: int) -> int | None:
        """The longest chain of deltas that ends at `cid` (0: nothing depends on it); None
        past `limit`."""
        best = 0
        for dep in self.dependents(txn, cid):
            if limit <= 0:
                return None
            below = self.dependent_height(txn, dep, limit - 1)
            if below is None:
                return None
            best = max(best, below + 1)
        return best

    def hot_frame(self, txn: lmdb.Transaction, where: HotFrame) -> bytes | memoryview | None:
        """A frame from the frame environment (`txn` is a frame-environment transaction)."""
        return txn.get(seq_key(where.seq), db=self._frames)

    def inline_frame(
        self, txn: lmdb.Transaction, cid: bytes, where: Inline
    ) -> bytes | memoryview | None:
        """The frame of an inline chunk (`txn` is a catalog transaction)."""
        if where.seq:
            return txn.get(seq_key(where.seq), db=self._inline)
        return txn.get(cid, db=self._inline_by_id)

    def _drop_inline(self, txn: lmdb.Transaction, cid: bytes, where: Inline) -> None:
        if where.seq:
            txn.delete(seq_key(where.seq), db=self._inline)
        else:
            txn.delete(cid, db=self._inline_by_id)

    def hot_frame_seqs(self) -> set[int]:
        """Sequence numbers of every frame in the frame environment."""
        with self.frames_env.read() as txn:
            cur = txn.cursor(db=self._frames)
            return {_seq_of(k) for k in cur.iternext(keys=True, values=False)}

    def packed_locations(self, txn: lmdb.Transaction) -> Iterator[tuple[bytes, Packed]]:
        """Every packed chunk and its place."""
        for key, raw in txn.cursor(db=self._packed):
            yield bytes(key), Packed.decode(raw)

    def tier_totals(self, txn: lmdb.Transaction, tiers: Iterable[str]) -> dict[str, dict[str, int]]:
        """Chunks and stored bytes per tier; hot is whatever is not in another tier."""
        get = self.counters.get
        out = {
            t: {"chunks": get(txn, f"tier:{t}:chunks"), "bytes": get(txn, f"tier:{t}:bytes")}
            for t in tiers
        }
        out["hot"] = {
            "chunks": get(txn, "chunks") - sum(v["chunks"] for v in out.values()),
            "bytes": get(txn, "stored_bytes") - sum(v["bytes"] for v in out.values()),
        }
        return out

    # -- changes (writer thread) ------------------------------------------------------
    def set_meta(self, txn: lmdb.Transaction, cid: bytes, meta: ChunkMeta) -> None:
        """Write the metadata record (not the tables behind its location: see the moves)."""
        txn.put(cid, _META.pack(*meta[:-1], _disk_seq(meta.where)), db=self._meta)

    def _place(self, w: WriteTxn, cid: bytes, old: Location | None, new: Location) -> None:
        """Switch the catalog tables behind a location from `old` to `new`. An old hot frame
        is left for the caller: a move drops it in a later batch (invariant: never a pointer
        to nothing), healing at once (the frame is damaged anyway)."""
        if isinstance(old, Inline) and old != new:
            self._drop_inline(w.catalog, cid, old)
        if isinstance(old, Packed) and not isinstance(new, Packed):
            w.catalog.delete(cid, db=self._packed)
        if isinstance(new, Packed):
            w.catalog.put(cid, new.encode(), db=self._packed)

    def _count_tier(
        self, txn: lmdb.Transaction, where: Location | None, n: int, nbytes: int
    ) -> None:
        if isinstance(where, Packed):
            self.counters.add(txn, f"tier:{where.tier}:chunks", n)
            self.counters.add(txn, f"tier:{where.tier}:bytes", nbytes)

    def _count_codec(self, txn: lmdb.Transaction, meta: ChunkMeta, sign: int) -> None:
        """Per-codec totals for recoded chunks (the rest is as ingested)."""
        if meta.flags & _CODEC_FLAGS:
            self.counters.add(txn, f"codec:{meta.codec}:chunks", sign)
            self.counters.add(txn, f"codec:{meta.codec}:bytes", sign * meta.stored)
            self.counters.add(txn, f"codec:{meta.codec}:plain", sign * meta.size)

    def codec_totals(self, txn: lmdb.Transaction) -> dict[str, dict[str, int]]:
        """Chunks, stored and plaintext bytes of the recoded codecs."""
        get = self.counters.get
        return {
            c: {k: get(txn, f"codec:{c}:{k}") for k in ("chunks", "bytes", "plain")}
            for c in ("grouped", "delta")
        }

    def _unlink_base(self, txn: lmdb.Transaction, cid: bytes) -> None:
        base = self.base_of(txn, cid)
        if base is not None:
            txn.delete(cid, db=self._deltas)
            txn.delete(base + cid, db=self._bases)

    def _new_hot_frame(self, w: WriteTxn, frame: bytes | memoryview) -> HotFrame:
        where = HotFrame(self._next_seq)
        self._next_seq += 1
        w.frames.put(seq_key(where.seq), frame, db=self._frames, append=True)
        return where

    def store(
        self,
        w: WriteTxn,
        cid: bytes,
        data: bytes | memoryview,
        frame: bytes | memoryview | None,
        now_ms: int,
        reserve_until_ms: int,
        inline: bool = False,
    ) -> tuple[bool, int, int]:
        """Keep a chunk the caller holds: reserve a sound stored copy, or write ours.

        `frame` is the chunk already encoded off the writer thread when the caller believed
        it absent; a chunk that vanished or was found damaged since is encoded here.
        Returns (bytes written?, chunks added, stored bytes added); the caller updates the
        counters once per batch.
        """
        meta = self.meta(w.catalog, cid)
        if meta is not None and not meta.damaged:
            self.reserve(w.catalog, cid, meta, reserve_until_ms)
            return False, 0, 0
        body = frame if frame is not None else Encoder().encode(data)
        where: Location
        if inline:
            where = Inline(self._next_seq)
            self._next_seq += 1
            w.catalog.put(seq_key(where.seq), body, db=self._inline, append=True)
        else:
            where = self._new_hot_frame(w, body)
        # A patch (a small file against its parent's, vault/smallfile.py) is linked to its
        # base as a compaction delta is: the caller checked the base is sound and the chain
        # within bounds.
        base = delta_base(body)
        flags = FLAG_DELTA if base is not None else 0
        if meta is None:
            stored = ChunkMeta(0, len(data), len(body), now_ms, reserve_until_ms, flags, where)
            self._link(w.catalog, cid, base, stored)
            return True, 1, len(body)
        # healing: the damaged frame goes, the new one takes its place
        self._place(w, cid, meta.where, where)
        self.drop_hot_frames(w.frames, [meta.where])
        self._count_tier(w.catalog, meta.where, -1, -meta.stored)
        self._count_codec(w.catalog, meta, -1)
        self._unlink_base(w.catalog, cid)
        healed = meta._replace(
            stored=len(body),
            flags=(meta.flags & ~(FLAG_DAMAGED | _CODEC_FLAGS)) | flags,
            where=where,
            reserved_until_ms=max(meta.reserved_until_ms, reserve_until_ms),
        )
        self._link(w.catalog, cid, base, healed)
        return True, 0, len(body) - meta.stored

    def _link(self, txn: lmdb.Transaction, cid: bytes, base: bytes | None, meta: ChunkMeta) -> None:
        """Write a newly stored chunk's metadata, and its delta link if it has a base."""
        if base is not None:
            txn.put(cid, base, db=self._deltas)
            txn.put(base + cid, b"", db=self._bases)
            self._count_codec(txn, meta, 1)
        self.set_meta(txn, cid, meta)

    def adopt(
        self,
        w: WriteTxn,
        cid: bytes,
        where: Packed,
        size: int,
        flags: int,
        now_ms: int,
        reserve_until_ms: int,
    ) -> bool:
        """Name a chunk another node shipped to the shared tier (vault/content/shared.py):
        metadata pointing at its pack, unreferenced and reserved like a chunk a session
        sent. False if the catalog has it already (it keeps its own copy)."""
        if self.meta(w.catalog, cid) is not None:
            return False
        meta = ChunkMeta(0, size, where.length, now_ms, reserve_until_ms, flags, where)
        self._place(w, cid, None, where)
        self._count_tier(w.catalog, where, 1, where.length)
        self._count_codec(w.catalog, meta, 1)
        self.set_meta(w.catalog, cid, meta)
        self.counters.add(w.catalog, "chunks", 1)
        self.counters.add(w.catalog, "stored_bytes", where.length)
        return True

    def reserve(self, txn: lmdb.Transaction, cid: bytes, meta: ChunkMeta, until_ms: int) -> None:
        if meta.reserved_until_ms < until_ms:
            self.set_meta(txn, cid, meta._replace(reserved_until_ms=until_ms))

    def add_refs(
        self, txn: lmdb.Transaction, cids: Iterable[bytes], delta: int, now_ms: int
    ) -> None:
        """Change reference counts; a count reaching zero starts the GC grace period."""
        for cid in cids:
            raw = txn.get(cid, db=self._meta)
            if raw is None:  # only reachable through catalog drift; check() reports it
                continue
            buf = bytearray(raw)
            refs = max(0, _REFS.unpack_from(buf)[0] + delta)
            _REFS.pack_into(buf, 0, refs)
            _ZERO_SINCE.pack_into(buf, 16, now_ms if refs == 0 else 0)
            txn.put(cid, buf, db=self._meta)

    def move(self, w: WriteTxn, cid: bytes, meta: ChunkMeta, new: Packed) -> None:
        """Point a chunk at its copy in a pack (demotion from hot, or repacking). A hot frame
        left behind is dropped by the caller after this commits (`drop_hot_frames`): copy,
        verify, switch the pointer, then delete the source."""
        self._place(w, cid, meta.where, new)
        self._count_tier(w.catalog, meta.where, -1, -meta.stored)
        self._count_tier(w.catalog, new, 1, new.length)
        moved = meta._replace(where=new, stored=new.length)
        self._count_codec(w.catalog, meta, -1)
        self._count_codec(w.catalog, moved, 1)
        self.set_meta(w.catalog, cid, moved)
        self.counters.add(w.catalog, "stored_bytes", new.length - meta.stored)  # sealing adds some

    def move_hot(self, w: WriteTxn, cid: bytes, meta: ChunkMeta, frame: bytes) -> None:
        """Promotion: a verified plain frame back in the frame environment, the pointer
        switched in the same commit; the pack keeps the old copy as dead bytes until it is
        repacked."""
        where = self._new_hot_frame(w, frame)
        self._place(w, cid, meta.where, where)
        self._count_tier(w.catalog, meta.where, -1, -meta.stored)
        moved = meta._replace(where=where, stored=len(frame))
        self._count_codec(w.catalog, meta, -1)
        self._count_codec(w.catalog, moved, 1)
        self.set_meta(w.catalog, cid, moved)
        self.counters.add(w.catalog, "stored_bytes", len(frame) - meta.stored)

    def recode(self, w: WriteTxn, cid: bytes, meta: ChunkMeta, frame: bytes) -> None:
        """Compaction: the same plaintext in another frame (grouped, a delta against the base
        the frame names, or whole again), written as a new hot frame; the old hot frame is
        left for the caller to drop after this commits, like a move. The caller has checked
        that the base is sound and the chain stays within bounds."""
        base = delta_base(frame)
        codec = frame_codec(frame)
        where = self._new_hot_frame(w, frame)
        self._place(w, cid, meta.where, where)
        self._count_tier(w.catalog, meta.where, -1, -meta.stored)
        self._count_codec(w.catalog, meta, -1)
        self._unlink_base(w.catalog, cid)
        flags = meta.flags & ~_CODEC_FLAGS
        if codec == CODEC_DELTA:
            flags |= FLAG_DELTA
        elif codec == CODEC_GROUPED:
            flags |= FLAG_GROUPED
        recoded = meta._replace(where=where, stored=len(frame), flags=flags)
        if base is not None:
            w.catalog.put(cid, base, db=self._deltas)
            w.catalog.put(base + cid, b"", db=self._bases)
        self._count_codec(w.catalog, recoded, 1)
        self.set_meta(w.catalog, cid, recoded)
        self.counters.add(w.catalog, "stored_bytes", len(frame) - meta.stored)

    def forget(self, txn: lmdb.Transaction, cid: bytes, meta: ChunkMeta) -> None:
        """Drop a chunk from the catalog (an inline frame with it); a hot frame is deleted
        afterwards (`drop_hot_frames`), a packed one stays in its pack until a repack."""
        txn.delete(cid, db=self._meta)
        if isinstance(meta.where, Inline):
            self._drop_inline(txn, cid, meta.where)
        txn.delete(cid, db=self._packed)
        self._unlink_base(txn, cid)
        self._count_tier(txn, meta.where, -1, -meta.stored)
        self._count_codec(txn, meta, -1)
        self.counters.add(txn, "chunks", -1)
        self.counters.add(txn, "stored_bytes", -meta.stored)

    def drop_hot_frames(self, txn: lmdb.Transaction, places: Iterable[Location | None]) -> None:
        """Delete hot frames no metadata points to any more (frame-environment txn); other
        locations in `places` are ignored, so callers pass what they switched away from."""
        for where in places:
            if isinstance(where, HotFrame):
                txn.delete(seq_key(where.seq), db=self._frames)

    def drop_unnamed_frames(self, w: WriteTxn) -> int:
        """Delete frames no chunk metadata names (left by a crash between the two commits
        of a write batch), judged inside the writer where no batch is half done."""
        named = {_META.unpack(raw)[-1] for _, raw in w.catalog.cursor(db=self._meta)}
        cur = w.frames.cursor(db=self._frames)
        unnamed = [s for s in map(_seq_of, cur.iternext(keys=True, values=False)) if s not in named]
        for seq in unnamed:
            w.frames.delete(seq_key(seq), db=self._frames)
        return len(unnamed)

    def mark_damaged(self, txn: lmdb.Transaction, cid: bytes) -> list[bytes]:
        """Flag a chunk damaged, and every chunk whose read needs it as a base (they cannot
        be read either, so the missing query must ask for them too). Returns all flagged."""
        flagged: list[bytes] = []
        todo = [cid]
        while todo:
            c = todo.pop()
            meta = self.meta(txn, c)
            if meta is None or c in flagged:
                continue
            if not meta.damaged:
                self.set_meta(txn, c, meta._replace(flags=meta.flags | FLAG_DAMAGED))
            flagged.append(c)
            todo.extend(self.dependents(txn, c))
        return flagged

    def clear_damaged(self, txn: lmdb.Transaction, cids: Iterable[bytes]) -> None:
        """Unflag chunks a full read just verified (a delta whose damaged base was healed):
        damaged means unreadable, and these read."""
        for cid in cids:
            meta = self.meta(txn, cid)
            if meta is not None and meta.damaged:
                self.set_meta(txn, cid, meta._replace(flags=meta.flags & ~FLAG_DAMAGED))


def _suffixes(txn: lmdb.Transaction, db: lmdb._Database, prefix: bytes) -> list[bytes]:
    """The rest of every key of `db` that starts with the chunk id `prefix`."""
    cur = txn.cursor(db=db)
    out: list[bytes] = []
    if cur.set_range(prefix):
        for key in cur.iternext(keys=True, values=False):
            if bytes(key[:ID_LEN]) != prefix:
                break
            out.append(bytes(key[ID_LEN:]))
    return out


def settle_restored(catalog: Env) -> dict[str, int]:
    """A catalog restored without its frame environment (a lost machine): hot frames are
    gone, so their chunks are flagged damaged (verify invalidates what needs them, and the
    next upload of the same bytes heals them), inline and packed chunks stay readable, and
    new frames are numbered past every number the catalog mentions, so a stale pointer can
    never name a new frame. Runs before any writer exists: a plain write transaction."""
    db = catalog.db["chunkmeta"]
    lost = cold = 0
    highest = 0
    with catalog.lmdb.begin(write=True) as txn:
        for key, raw in list(txn.cursor(db=db)):
            fields = list(_META.unpack(raw))
            seq = fields[-1]
            if seq == _SEQ_PACKED:
                cold += 1
            elif not _inline_disk_seq(seq):
                highest = max(highest, seq)
                lost += 1
                fields[5] |= FLAG_DAMAGED
                txn.put(key, _META.pack(*fields), db=db)
        Counters(catalog).add(txn, SEQ_FLOOR, highest + 1)
        # a lost base makes its dependents unreadable: flag them too
        todo = [bytes(k[:ID_LEN]) for k, _ in txn.cursor(db=catalog.db["bases"])]
        seen: set[bytes] = set()
        while todo:
            base = todo.pop()
            found = txn.get(base, db=db)
            if base in seen or found is None or not _META.unpack(found)[5] & FLAG_DAMAGED:
                continue
            seen.add(base)
            for dep in _suffixes(txn, catalog.db["bases"], base):
                dep_raw = txn.get(dep, db=db)
                if dep_raw is not None:
                    fields = list(_META.unpack(dep_raw))
                    fields[5] |= FLAG_DAMAGED
                    txn.put(dep, _META.pack(*fields), db=db)
                    todo.append(dep)
    return {"cold_chunks": cold, "lost_hot_chunks": lost}
