"""The hot chunk store: frames and per-chunk metadata in LMDB, as transaction-level helpers.

A chunk's metadata carries its reference count (number of live checkpoints whose manifest
lists it), when that count last reached zero (the GC grace period runs from there), until
when a live upload has reserved it, and whether scrub found it damaged. Functions here take
an open transaction; the writer thread and read paths compose them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, replace

import lmdb

from .env import Env

_META = struct.Struct("<QIIqqB")
FLAG_DAMAGED = 1


@dataclass(frozen=True)
class ChunkMeta:
    refs: int
    size: int  # plaintext bytes
    stored: int  # frame bytes
    zero_since_ms: int  # when refs last became 0 (0 while referenced)
    reserved_until_ms: int  # a live upload may reference it until then
    flags: int = 0

    @property
    def damaged(self) -> bool:
        return bool(self.flags & FLAG_DAMAGED)

    def pack(self) -> bytes:
        return _META.pack(
            self.refs,
            self.size,
            self.stored,
            self.zero_since_ms,
            self.reserved_until_ms,
            self.flags,
        )

    @classmethod
    def unpack(cls, raw: bytes | memoryview) -> ChunkMeta:
        return cls(*_META.unpack(raw))


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
    def __init__(self, env: Env) -> None:
        self._env = env
        self._data = env.db["chunks"]
        self._meta = env.db["chunkmeta"]
        self.counters = Counters(env)

    def meta(self, txn: lmdb.Transaction, cid: bytes) -> ChunkMeta | None:
        raw = txn.get(cid, db=self._meta)
        return ChunkMeta.unpack(raw) if raw is not None else None

    def set_meta(self, txn: lmdb.Transaction, cid: bytes, meta: ChunkMeta) -> None:
        txn.put(cid, meta.pack(), db=self._meta)

    def frame(self, txn: lmdb.Transaction, cid: bytes) -> bytes | memoryview | None:
        return txn.get(cid, db=self._data)

    def usable(self, txn: lmdb.Transaction, cid: bytes) -> bool:
        """Stored and not known to be damaged: what dedup and commit may rely on."""
        meta = self.meta(txn, cid)
        return meta is not None and not meta.damaged

    def put(
        self,
        txn: lmdb.Transaction,
        cid: bytes,
        size: int,
        frame: bytes,
        now_ms: int,
        reserve_until_ms: int,
    ) -> bool:
        """Store a chunk unless a sound copy exists; return True if bytes were written.

        A damaged chunk is overwritten: the next upload of the same bytes heals it.
        """
        meta = self.meta(txn, cid)
        if meta is not None and not meta.damaged:
            self.reserve(txn, cid, meta, reserve_until_ms)
            return False
        txn.put(cid, frame, db=self._data)
        if meta is None:
            meta = ChunkMeta(0, size, len(frame), now_ms, reserve_until_ms)
            self.counters.add(txn, "chunks", 1)
            self.counters.add(txn, "stored_bytes", len(frame))
        else:
            self.counters.add(txn, "stored_bytes", len(frame) - meta.stored)
            meta = replace(
                meta,
                stored=len(frame),
                flags=meta.flags & ~FLAG_DAMAGED,
                reserved_until_ms=max(meta.reserved_until_ms, reserve_until_ms),
            )
        self.set_meta(txn, cid, meta)
        return True

    def reserve(self, txn: lmdb.Transaction, cid: bytes, meta: ChunkMeta, until_ms: int) -> None:
        if meta.reserved_until_ms < until_ms:
            self.set_meta(txn, cid, replace(meta, reserved_until_ms=until_ms))

    def add_refs(
        self, txn: lmdb.Transaction, cids: Iterable[bytes], delta: int, now_ms: int
    ) -> None:
        """Change reference counts; a count reaching zero starts the GC grace period."""
        for cid in cids:
            meta = self.meta(txn, cid)
            if meta is None:  # only reachable through catalog drift; check() reports it
                continue
            refs = max(0, meta.refs + delta)
            zero_since = now_ms if refs == 0 else 0
            self.set_meta(txn, cid, replace(meta, refs=refs, zero_since_ms=zero_since))

    def delete(self, txn: lmdb.Transaction, cid: bytes, meta: ChunkMeta) -> None:
        txn.delete(cid, db=self._data)
        txn.delete(cid, db=self._meta)
        self.counters.add(txn, "chunks", -1)
        self.counters.add(txn, "stored_bytes", -meta.stored)

    def mark_damaged(self, txn: lmdb.Transaction, cid: bytes) -> None:
        meta = self.meta(txn, cid)
        if meta is not None and not meta.damaged:
            self.set_meta(txn, cid, replace(meta, flags=meta.flags | FLAG_DAMAGED))
