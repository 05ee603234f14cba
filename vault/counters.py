"""Running totals (chunks, stored and logical bytes, checkpoints, bytes per tier, open
uploads), kept in the catalog in the same transactions as the changes they count."""

from __future__ import annotations

import struct

import lmdb

from .env import Env

_VALUE = struct.Struct("<q")


class Counters:
    def __init__(self, env: Env) -> None:
        self._db = env.db["counters"]

    def add(self, txn: lmdb.Transaction, name: str, delta: int) -> None:
        key = name.encode()
        raw = txn.get(key, db=self._db)
        value = _VALUE.unpack(raw)[0] if raw is not None else 0
        txn.put(key, _VALUE.pack(value + delta), db=self._db)

    def with_prefix(self, txn: lmdb.Transaction, prefix: str) -> dict[str, int]:
        """Every counter named `prefix` + something, by that something."""
        start = prefix.encode()
        out: dict[str, int] = {}
        cur = txn.cursor(db=self._db)
        ok = cur.set_range(start)
        while ok and bytes(cur.key()).startswith(start):
            out[bytes(cur.key())[len(start) :].decode()] = int(_VALUE.unpack(cur.value())[0])
            ok = cur.next()
        return out

    def get(self, txn: lmdb.Transaction, name: str) -> int:
        raw = txn.get(name.encode(), db=self._db)
        return int(_VALUE.unpack(raw)[0]) if raw is not None else 0
