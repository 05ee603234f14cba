"""Idempotency keys of one-request saves: a retried save returns what the first one made.

A key maps to the namespace and checkpoint its first save created, and lives as long as an
upload session would (`upload_ttl`): long enough for any client's retries, short enough that
the table stays small. Expired keys are dropped by GC with expired sessions.
"""

from __future__ import annotations

import json
import re

import lmdb

from .errors import Conflict, InvalidRequest
from .records import CheckpointRecord
from .store import Store

_KEY = re.compile(r"[A-Za-z0-9_-]{16,64}")


def check_key(key: str) -> None:
    if not _KEY.fullmatch(key):
        raise InvalidRequest("idempotency key must be 16-64 characters of [A-Za-z0-9_-]")


class IdempotencyKeys:
    def __init__(self, store: Store) -> None:
        self._s = store
        self._db = store.catalog_env.db["idempotency"]

    def replay(self, txn: lmdb.Transaction, key: str, ns: str) -> CheckpointRecord | None:
        """The checkpoint an earlier save with this key made, if any."""
        raw = txn.get(key.encode(), db=self._db)
        if raw is None:
            return None
        entry = json.loads(bytes(raw))
        rec = self._s.catalog.record(txn, entry["checkpoint"])
        if rec is None or entry["namespace"] != ns:
            raise Conflict(f"idempotency key {key!r} is in use by another request")
        return rec

    def remember(self, txn: lmdb.Transaction, key: str, rec: CheckpointRecord, now: float) -> None:
        entry = {
            "namespace": rec.namespace,
            "checkpoint": rec.id,
            "expires_at": now + self._s.config.upload_ttl,
        }
        txn.put(key.encode(), json.dumps(entry, separators=(",", ":")).encode(), db=self._db)

    def expire(self, txn: lmdb.Transaction, now: float) -> int:
        """Drop keys past their expiry (writer thread); returns how many went."""
        cur = txn.cursor(db=self._db)
        gone = [bytes(k) for k, v in cur if json.loads(bytes(v))["expires_at"] <= now]
        for key in gone:
            txn.delete(key, db=self._db)
        return len(gone)
