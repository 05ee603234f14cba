"""The hot chunk store: frames in the frame environment, per-chunk metadata in the catalog.

A chunk's metadata carries its reference count (number of live checkpoints whose manifest
lists it), when that count last reached zero (the GC grace period runs from there), until
when a live upload has reserved it, whether it was found damaged, and the sequence number
of its frame. Frames are keyed by that sequence number (big endian, so appends go to the
end of the B-tree); a frame is never rewritten in place: healing a damaged chunk writes a
new frame under a new number and points the metadata at it.

Chunks moved to another tier are *packed*: their frame lives at a byte range of a pack object
in that tier, recorded in the catalog (sequence number PACKED).

Chunks of one-request saves (small checkpoints, agent state) are stored *inline*: the frame
sits in the catalog environment next to its metadata (sequence number 0), so such a save
commits one environment, not two, which halves its fsyncs. Their total size is bounded by
the one-request limit per save, so the catalog stays small next to the frame store.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import lmdb

from .env import Env
from .frame import Encoder
from .writer import WriteTxn

_META = struct.Struct("<QIIqqBQ")
# Hot paths touch single fields in place (every commit adjusts one count per chunk).
_REFS = struct.Struct("<Q")  # at offset 0
_ZERO_SINCE = struct.Struct("<q")  # at offset 16
_FLAGS_AT = 32
_SEQ = struct.Struct(">Q")
INLINE = 0  # ChunkMeta.seq of a frame kept in the catalog environment
SEQ_FLOOR = "frame_seq_floor"  # counter: new frames start at least here (after a restore)
PACKED = (1 << 64) - 1  # ChunkMeta.seq of a frame that lives in a pack in another tier
_LOCATION = struct.Struct("<QIH")  # offset, length, tier-name length; then name, then key


@dataclass(frozen=True)
class Location:
    """Where a packed chunk's frame is: which tier, which object, which bytes."""

    tier: str
    key: str
    offset: int
    length: int

    def pack(self) -> bytes:
        name = self.tier.encode()
        return _LOCATION.pack(self.offset, self.length, len(name)) + name + self.key.encode()

    @classmethod
    def unpack(cls, raw: bytes | memoryview) -> Location:
        offset, length, n = _LOCATION.unpack_from(raw)
        rest = bytes(raw[_LOCATION.size :])
        return cls(rest[:n].decode(), rest[n:].decode(), offset, length)


FLAG_DAMAGED = 1


class ChunkMeta(NamedTuple):
    """A NamedTuple, not a dataclass: commits rebuild one per chunk, and `_replace` on a
    tuple costs a tenth of `dataclasses.replace` (measured on agent saves)."""

    refs: int
    size: int  # plaintext bytes
    stored: int  # frame bytes
    zero_since_ms: int  # when refs last became 0 (0 while referenced)
    reserved_until_ms: int  # a live upload may reference it until then
    flags: int
    seq: int  # key of the frame in the frame environment, or INLINE

    @property
    def damaged(self) -> bool:
        return bool(self.flags & FLAG_DAMAGED)

    def pack(self) -> bytes:
        return _META.pack(*self)

    @classmethod
    def unpack(cls, raw: bytes | memoryview) -> ChunkMeta:
        return cls._make(_META.unpack(raw))


def seq_key(seq: int) -> bytes:
    return _SEQ.pack(seq)


def seq_of(key: bytes | memoryview) -> int:
    return int(_SEQ.unpack(key)[0])


class Counters:
    """Running totals kept in the same transactions as the changes they count."""

    _VALUE = struct.Struct("<q")

    def __init__(self, env: Env) -> None:
        self._db = env.db["counters"]

    def add(self, txn: lmdb.Transaction, name: str, delta: int) -> None:
        key = name.encode()
        raw = txn.get(key, db=self._db)
        value = self._VALUE.unpack(raw)[0] if raw is not None else 0
        txn.put(key, self._VALUE.pack(value + delta), db=self._db)

    def get(self, txn: lmdb.Transaction, name: str) -> int:
        raw = txn.get(name.encode(), db=self._db)
        return int(self._VALUE.unpack(raw)[0]) if raw is not None else 0


class Blocks:
    def __init__(self, catalog: Env, frames: Env) -> None:
        self.frames_env = frames
        self._frames = frames.db["frames"]
        self._meta = catalog.db["chunkmeta"]
        self._inline = catalog.db["inline"]
        self._packed = catalog.db["packed"]
        self.counters = Counters(catalog)
        with frames.read() as txn:
            cur = txn.cursor(db=self._frames)
            after_frames = seq_of(cur.key()) + 1 if cur.last() else 1
        with catalog.read() as txn:
            floor = self.counters.get(txn, SEQ_FLOOR)  # set by a catalog restore
        self._next_seq = max(after_frames, floor)  # writer thread only

    def meta(self, txn: lmdb.Transaction, cid: bytes) -> ChunkMeta | None:
        raw = txn.get(cid, db=self._meta)
        return ChunkMeta.unpack(raw) if raw is not None else None

    def set_meta(self, txn: lmdb.Transaction, cid: bytes, meta: ChunkMeta) -> None:
        txn.put(cid, meta.pack(), db=self._meta)

    def frame(self, txn: lmdb.Transaction, meta: ChunkMeta) -> bytes | memoryview | None:
        """The frame of a non-inline `meta`, read in a frame-environment transaction."""
        return txn.get(seq_key(meta.seq), db=self._frames)

    def inline_frame(self, txn: lmdb.Transaction, cid: bytes) -> bytes | memoryview | None:
        """The frame of an inline chunk, read in a catalog transaction."""
        return txn.get(cid, db=self._inline)

    def location(self, txn: lmdb.Transaction, cid: bytes) -> Location | None:
        """Where a packed chunk lives (catalog transaction)."""
        raw = txn.get(cid, db=self._packed)
        return Location.unpack(raw) if raw is not None else None

    def move_to_pack(
        self, txn: lmdb.Transaction, cid: bytes, meta: ChunkMeta, where: Location
    ) -> None:
        """Point a chunk at its copy in a pack; the caller deletes the old frame after the
        commit (copy, verify, switch the pointer, then delete the source)."""
        if meta.seq == INLINE:
            txn.delete(cid, db=self._inline)
        txn.put(cid, where.pack(), db=self._packed)
        self.set_meta(txn, cid, meta._replace(seq=PACKED, stored=where.length))
        self._count_tier(txn, where.tier, 1, where.length)
        self.counters.add(txn, "stored_bytes", where.length - meta.stored)  # sealing adds some

    def relocate(
        self, txn: lmdb.Transaction, cid: bytes, meta: ChunkMeta, old: Location, new: Location
    ) -> None:
        """Repacking: the chunk's frame now lives in another pack."""
        txn.put(cid, new.pack(), db=self._packed)
        self.set_meta(txn, cid, meta._replace(stored=new.length))
        self._count_tier(txn, old.tier, -1, -meta.stored)
        self._count_tier(txn, new.tier, 1, new.length)
        self.counters.add(txn, "stored_bytes", new.length - meta.stored)

    def move_to_hot(self, w: WriteTxn, cid: bytes, meta: ChunkMeta, frame: bytes) -> None:
        """Promotion: a verified plain frame back in the frame environment, the pointer
        switched in the same commit; the pack keeps the old copy as dead bytes until it is
        repacked."""
        where = self.location(w.cat, cid)
        seq = self._next_seq
        self._next_seq += 1
        w.data.put(seq_key(seq), frame, db=self._frames, append=True)
        w.cat.delete(cid, db=self._packed)
        self.set_meta(w.cat, cid, meta._replace(seq=seq, stored=len(frame)))
        if where is not None:
            self._count_tier(w.cat, where.tier, -1, -meta.stored)
        self.counters.add(w.cat, "stored_bytes", len(frame) - meta.stored)

    def _count_tier(self, txn: lmdb.Transaction, tier: str, chunks: int, nbytes: int) -> None:
        self.counters.add(txn, f"tier:{tier}:chunks", chunks)
        self.counters.add(txn, f"tier:{tier}:bytes", nbytes)

    def tier_totals(self, txn: lmdb.Transaction, tiers: Iterable[str]) -> dict[str, dict[str, int]]:
        """Chunks and stored bytes per tier; hot is whatever is not in another tier."""
        out = {
            t: {
                "chunks": self.counters.get(txn, f"tier:{t}:chunks"),
                "bytes": self.counters.get(txn, f"tier:{t}:bytes"),
            }
            for t in tiers
        }
        out["hot"] = {
            "chunks": self.counters.get(txn, "chunks") - sum(v["chunks"] for v in out.values()),
            "bytes": self.counters.get(txn, "stored_bytes") - sum(v["bytes"] for v in out.values()),
        }
        return out

    def usable(self, txn: lmdb.Transaction, cid: bytes) -> bool:
        """Stored and not known to be damaged: what dedup and commit may rely on."""
        raw = txn.get(cid, db=self._meta)
        return raw is not None and not raw[_FLAGS_AT] & FLAG_DAMAGED

    def store(
        self,
        w: WriteTxn,
        cid: bytes,
        data: bytes | memoryview,
        frame: bytes | None,
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
        meta = self.meta(w.cat, cid)
        if meta is not None and not meta.damaged:
            self.reserve(w.cat, cid, meta, reserve_until_ms)
            return False, 0, 0
        body = frame if frame is not None else Encoder().encode(data)
        if inline:
            seq = INLINE
            w.cat.put(cid, body, db=self._inline)
        else:
            seq = self._next_seq
            self._next_seq += 1
            w.data.put(seq_key(seq), body, db=self._frames, append=True)
        if meta is None:
            self.set_meta(
                w.cat, cid, ChunkMeta(0, len(data), len(body), now_ms, reserve_until_ms, 0, seq)
            )
            return True, 1, len(body)
        # healing: the damaged frame goes, the new one takes its place
        if meta.seq == INLINE and not inline:
            w.cat.delete(cid, db=self._inline)
        elif meta.seq == PACKED:  # a fresh hot copy replaces the damaged packed one
            where = self.location(w.cat, cid)
            w.cat.delete(cid, db=self._packed)
            if where is not None:
                self._count_tier(w.cat, where.tier, -1, -meta.stored)
        elif meta.seq != INLINE:
            w.data.delete(seq_key(meta.seq), db=self._frames)
        new = meta._replace(
            stored=len(body),
            flags=meta.flags & ~FLAG_DAMAGED,
            seq=seq,
            reserved_until_ms=max(meta.reserved_until_ms, reserve_until_ms),
        )
        self.set_meta(w.cat, cid, new)
        return True, 0, len(body) - meta.stored

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

    def forget(self, txn: lmdb.Transaction, cid: bytes, meta: ChunkMeta) -> None:
        """Drop a chunk from the catalog (an inline frame with it); a frame in the frame
        environment is deleted afterwards (`drop_frames`)."""
        txn.delete(cid, db=self._meta)
        if meta.seq == INLINE:
            txn.delete(cid, db=self._inline)
        elif meta.seq == PACKED:  # the pack keeps the bytes until it is repacked
            where = self.location(txn, cid)
            txn.delete(cid, db=self._packed)
            if where is not None:
                self._count_tier(txn, where.tier, -1, -meta.stored)
        self.counters.add(txn, "chunks", -1)
        self.counters.add(txn, "stored_bytes", -meta.stored)

    def drop_frames(self, txn: lmdb.Transaction, seqs: Iterable[int]) -> None:
        """Delete frames no metadata points to any more (frame-environment transaction)."""
        for seq in seqs:
            txn.delete(seq_key(seq), db=self._frames)

    def mark_damaged(self, txn: lmdb.Transaction, cid: bytes) -> None:
        meta = self.meta(txn, cid)
        if meta is not None and not meta.damaged:
            self.set_meta(txn, cid, meta._replace(flags=meta.flags | FLAG_DAMAGED))
