"""Idempotency keys of one-request saves: a retried save returns what the first one made.

A key maps to the namespace and checkpoint its first save created, and lives as long as an
upload session would (`upload_ttl`): long enough for any client's retries, short enough that
the table stays small. Expired keys are dropped by GC with expired sessions.

An agent saves at every step, so there are as many keys as recent checkpoints: each is
stored compactly, under the 16-byte BLAKE3 of the key, as its expiry (f64) and checkpoint
id; the namespace is the checkpoint record's. Keys of older versions (the key itself ->
JSON) are still found and expired.
"""

from __future__ import annotations

import json
import re
import struct

import blake3
import lmdb

from .errors import Conflict, InvalidRequest
from .records import StoredCheckpoint
from .store import Store

_KEY = re.compile(r"[A-Za-z0-9_-]{16,64}")
_EXPIRY = struct.Struct("<d")


def _stored_key(key: str) -> bytes:
    return blake3.blake3(key.encode()).digest()[:16]


def _expiry(raw: bytes) -> float:
    # An older version's entry is a JSON object. A compact one starts with its expiry's
    # lowest byte, which can be "{" too (1 in 256 keys: GC then failed on every run until
    # that key expired), but ends with its checkpoint id, never "}".
    if raw[:1] == b"{" and raw[-1:] == b"}":
        return float(json.loads(raw)["expires_at"])
    return float(_EXPIRY.unpack_from(raw)[0])


def check_key(key: str) -> None:
    if not _KEY.fullmatch(key):
        raise InvalidRequest("idempotency key must be 16-64 characters of [A-Za-z0-9_-]")


class IdempotencyKeys:
    def __init__(self, store: Store) -> None:
        self._s = store
        self._db = store.catalog_env.db["idempotency"]

    def replay(self, txn: lmdb.Transaction, key: str, ns: str) -> StoredCheckpoint | None:
        """The checkpoint an earlier save with this key made, if any."""
        raw = txn.get(_stored_key(key), db=self._db)
        if raw is not None:
            cid = bytes(raw)[_EXPIRY.size :].decode()
        elif (old := txn.get(key.encode(), db=self._db)) is not None:
            cid = json.loads(bytes(old))["checkpoint"]
        else:
            return None
        rec = self._s.catalog.record(txn, cid)
        if rec is None or rec.namespace != ns:
            raise Conflict(f"idempotency key {key!r} is in use by another request")
        return rec

    def remember(self, txn: lmdb.Transaction, key: str, rec: StoredCheckpoint, now: float) -> None:
        entry = _EXPIRY.pack(now + self._s.config.upload_ttl) + rec.id.encode()
        txn.put(_stored_key(key), entry, db=self._db)

    def expire(self, txn: lmdb.Transaction, now: float) -> int:
        """Drop keys past their expiry (writer thread); returns how many went."""
        cur = txn.cursor(db=self._db)
        gone = [bytes(k) for k, v in cur if _expiry(bytes(v)) <= now]
        for key in gone:
            txn.delete(key, db=self._db)
        return len(gone)
