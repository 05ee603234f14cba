"""What one write batch changed, recorded as it happens, and its wire form.

LMDB keeps no log to ship, but every write goes through the writer thread, which hands each
operation a `WriteTxn`. With replication on, the writer hands out recording views of those
transactions instead: each put, delete and drop goes to LMDB as before and is also noted
here, in order, as a blind write (the value as stored, never "add 1"). Blind writes are what
make replay safe over a fuzzy base copy: applying a batch to a state that already contains
it, or a later state, ends where the primary ended once the rest of the log is applied
(vault/replication/shipper.py, "Invariant").

Only operations whose nested transactions commit reach the log: the writer passes on the
records of committed operations and drops those of failed ones, exactly as LMDB does.

Wire form of a batch: header (batch number u64, commit time f64, record count u32), then
records (environment u8, kind u8, database index u8, key length u32, key, value length u32,
value). Frames' records come before the catalog's, the order the writer commits them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..env import CATALOG_DBS, FRAME_DBS

CATALOG, FRAMES = 0, 1
PUT, DELETE, DROP = 0, 1, 2
ENV_DBS = {CATALOG: CATALOG_DBS, FRAMES: FRAME_DBS}
_HEAD = struct.Struct(">QdI")
_REC = struct.Struct(">BBBI")
_LEN = struct.Struct(">I")

Record = tuple[int, int, int, bytes, bytes]  # env, kind, database index, key, value


@dataclass
class BatchLog:
    """The records of one committed write batch (frames first, then catalog)."""

    number: int
    committed_at: float
    records: list[Record] = field(default_factory=list)

    def encode(self) -> bytes:
        parts = [_HEAD.pack(self.number, self.committed_at, len(self.records))]
        for env, kind, db, key, value in self.records:
            parts += [_REC.pack(env, kind, db, len(key)), key, _LEN.pack(len(value)), value]
        return b"".join(parts)


def decode_batches(raw: bytes) -> Iterator[BatchLog]:
    """The batches of a segment body, in order."""
    view = memoryview(raw)
    pos = 0
    while pos < len(view):
        number, when, count = _HEAD.unpack_from(view, pos)
        pos += _HEAD.size
        batch = BatchLog(number, when)
        for _ in range(count):
            env, kind, db, klen = _REC.unpack_from(view, pos)
            pos += _REC.size
            key = bytes(view[pos : pos + klen])
            pos += klen
            (vlen,) = _LEN.unpack_from(view, pos)
            pos += _LEN.size
            batch.records.append((env, kind, db, key, bytes(view[pos : pos + vlen])))
            pos += vlen
        yield batch


def replay(txn: Any, db: Any, kind: int, key: bytes, value: bytes) -> None:
    """Apply one record to a write transaction (a delete of an absent key is no error:
    replay over a state that already has it)."""
    if kind == PUT:
        txn.put(key, value, db=db)
    elif kind == DELETE:
        txn.delete(key, db=db)
    elif kind == DROP:
        txn.drop(db, delete=False)


class Recording:
    """Where one operation's records collect; per environment, so frames can go first."""

    def __init__(self) -> None:
        self.by_env: dict[int, list[Record]] = {CATALOG: [], FRAMES: []}


class RecordingTxn:
    """A write transaction that also records what it changes (everything else passes)."""

    def __init__(self, txn: Any, env: int, dbs: dict[int, int], into: Recording) -> None:
        self._txn = txn
        self._env = env
        self._dbs = dbs  # id(database handle) -> index in ENV_DBS[env]
        self._into = into.by_env[env]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)

    def _index(self, db: Any) -> int:
        if db is None:
            raise ValueError("replicated writes name their database")
        return self._dbs[id(db)]

    def put(self, key: Any, value: Any, *args: Any, db: Any = None, **kw: Any) -> bool:
        done = bool(self._txn.put(key, value, *args, db=db, **kw))
        if done:
            self._into.append((self._env, PUT, self._index(db), bytes(key), bytes(value)))
        return done

    def delete(self, key: Any, value: Any = b"", db: Any = None) -> bool:
        done = bool(self._txn.delete(key, value, db=db))
        if done:
            if value:
                raise ValueError("replicated deletes remove whole keys")
            self._into.append((self._env, DELETE, self._index(db), bytes(key), b""))
        return done

    def drop(self, db: Any, delete: bool = True) -> None:
        if delete:
            raise ValueError("replicated databases are emptied, never removed")
        self._txn.drop(db, delete=False)
        self._into.append((self._env, DROP, self._index(db), b"", b""))

    def cursor(self, db: Any = None) -> RecordingCursor:
        return RecordingCursor(self._txn.cursor(db=db), self, self._index(db))


class RecordingCursor:
    """A cursor of a recording transaction: its deletes and puts are recorded too."""

    def __init__(self, cur: Any, txn: RecordingTxn, db: int) -> None:
        self._cur = cur
        self._txn = txn
        self._db = db

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cur)

    def delete(self, dupdata: bool = False) -> bool:
        key = bytes(self._cur.key())
        done = bool(self._cur.delete(dupdata))
        if done:
            self._txn._into.append((self._txn._env, DELETE, self._db, key, b""))
        return done

    def put(self, key: Any, value: Any, *args: Any, **kw: Any) -> bool:
        done = bool(self._cur.put(key, value, *args, **kw))
        if done:
            self._txn._into.append((self._txn._env, PUT, self._db, bytes(key), bytes(value)))
        return done
