"""Idempotency keys of one-request saves: a retried save returns what the first one made.

A key maps to the namespace and checkpoint its first save created, and lives as long as an
upload session would (`upload_ttl`): long enough for any client's retries, short enough that
the table stays small. Expired keys are dropped by GC with expired sessions.

An agent saves at every step, so there are as many keys as recent checkpoints: each is
stored compactly, under the 16-byte BLAKE3 of the key, as its expiry (f64) and checkpoint
id; the namespace is the checkpoint record's. Keys of older versions (the key itself ->
JSON) are still found and expired.

A key is its token's own: it is stored under the BLAKE3 of the token name and the key, so
the same key from another token is another entry. Keys were global once, which told a
tenant whether another had used a key (a 200 with the other's checkpoint, or a 409) and let
it take predictable keys first. An entry stored by a version that did not scope keys (the
BLAKE3 of the key alone) is believed only for the token that made its checkpoint; for any
other it does not exist.
"""

from __future__ import annotations

import json
import re
import struct
from functools import lru_cache

import blake3
import lmdb

from .errors import Conflict, InvalidRequest
from .records import StoredCheckpoint
from .store import Store

_KEY = re.compile(r"[A-Za-z0-9_-]{16,64}")
_EXPIRY = struct.Struct("<d")


@lru_cache(maxsize=1024)  # the writer asks twice a save: replay, then remember
def _stored_key(key: str, by: str | None) -> bytes:
    """Where `by`'s key is: a token name never holds a NUL, so no two (token, key) pairs
    hash the same text. `by` None (the engine used without tokens) is a token of its own."""
    scope = "\0" if by is None else by + "\0"
    return blake3.blake3((scope + key).encode()).digest()[:16]


def _unscoped_key(key: str) -> bytes:
    """Where a version that did not scope keys stored one (expired within upload_ttl)."""
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

    def replay(
        self, txn: lmdb.Transaction, key: str, ns: str, by: str | None
    ) -> StoredCheckpoint | None:
        """The checkpoint an earlier save by token `by` with this key made, if any; 409 if
        that save was to another namespace (the same token reusing a key)."""
        if (raw := txn.get(_stored_key(key, by), db=self._db)) is not None:
            rec = self._s.catalog.record(txn, bytes(raw)[_EXPIRY.size :].decode())
        elif (rec := self._unscoped(txn, key)) is not None and rec.created_by != by:
            return None  # another token's, from before keys were scoped: not this one's
        if rec is None:
            return None
        if rec.namespace != ns:
            raise Conflict(f"idempotency key {key!r} is in use by another request")
        return rec

    def _unscoped(self, txn: lmdb.Transaction, key: str) -> StoredCheckpoint | None:
        if (raw := txn.get(_unscoped_key(key), db=self._db)) is not None:
            cid = bytes(raw)[_EXPIRY.size :].decode()
        elif (old := txn.get(key.encode(), db=self._db)) is not None:
            cid = json.loads(bytes(old))["checkpoint"]
        else:
            return None
        return self._s.catalog.record(txn, cid)

    def remember(
        self, txn: lmdb.Transaction, key: str, by: str | None, rec: StoredCheckpoint, now: float
    ) -> None:
        entry = _EXPIRY.pack(now + self._s.config.upload_ttl) + rec.id.encode()
        txn.put(_stored_key(key, by), entry, db=self._db)

    def expire(self, txn: lmdb.Transaction, now: float) -> int:
        """Drop keys past their expiry (writer thread); returns how many went."""
        cur = txn.cursor(db=self._db)
        gone = [bytes(k) for k, v in cur if _expiry(bytes(v)) <= now]
        for key in gone:
            txn.delete(key, db=self._db)
        return len(gone)
