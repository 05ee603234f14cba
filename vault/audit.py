"""The audit log: who deleted, pinned, marked, retagged, changed a policy or ran an admin
operation, when, and under which request id.

Entries live in the catalog (database `audit`), so they are in every catalog backup and
survive restarts. Keys are the time in milliseconds (8 bytes, big endian) plus a 4-byte
sequence, so a reverse scan lists the newest first and entries written in the same
millisecond keep their order. Entries are appended by api/ after an action succeeded, in
a writer transaction of their own: a crash between the action and its entry loses the
entry (the action's own state, a tombstone or a record's validity source, remains).
Producer traffic (uploads, chunks, commits) is not audited: it is the bulk of requests and
the catalog itself records what it made.

The table is bounded twice, in the transaction that appends (as vault/samples.py prunes):
entries older than `max_age` go, and while the table's pages take more than `max_bytes`
the oldest entries *of the token that holds the most bytes of the log* go, so a token that
floods audited requests (a write token PATCHing in a loop) ages out its own entries, not
the record of what every other token did. Each append deletes at most `PRUNE_PER_APPEND`
entries, so its cost stays bounded when an operator lowers a bound on a big log: the log
shrinks to it over the next appends instead of in one long writer transaction. Before
issue 30 nothing was pruned and an entry kept the raw query (7 KB each, ~4 MB/s per write
token at the rate limit); before this, pruning took the oldest entries whoever made them.

Per token: an index `auditby` (token NUL key) finds its oldest entry, and counters
`audit_bytes:<token>` hold the bytes of its entries. A log written before them is indexed
once, at the first open that may write.
"""

from __future__ import annotations

import itertools
import json
import struct
from typing import TYPE_CHECKING, Protocol

import lmdb

from checkpoint_vault.protocol import AuditEntry

from .errors import InvalidRequest

if TYPE_CHECKING:
    from .counters import Counters
    from .env import Env
    from .writer import Writer


class AuditParts(Protocol):
    """What the audit log needs of the store: its catalog tables, counters and writer."""

    @property
    def catalog_env(self) -> Env: ...
    @property
    def counters(self) -> Counters: ...
    @property
    def writer(self) -> Writer: ...


_KEY = struct.Struct(">QI")
MAX_LIST = 1000
MAX_DETAIL_BYTES = 2048  # of the request body summary kept per entry
# Retention defaults ([audit] max_age, max_bytes). An entry takes ~300 bytes (a bulk
# delete listing its ids up to ~2.3 KB), so 64 MiB is a few hundred thousand actions:
# a quarter of admin history, in a catalog that backups copy whole.
MAX_AGE_SECONDS = 90 * 86400.0
MAX_BYTES = 64 << 20
# Entries one append may delete: more than the one it adds, so the log converges to its
# bounds; few enough that an append stays a short writer transaction.
PRUNE_PER_APPEND = 16
BYTES_BY = "audit_bytes:"  # counter prefix: bytes of a token's entries
INDEXED = "audit_indexed"  # counter: 1 once `auditby` and the byte counters cover the log


class AuditLog:
    def __init__(
        self, store: AuditParts, max_age: float = MAX_AGE_SECONDS, max_bytes: int = MAX_BYTES
    ) -> None:
        """`max_age` seconds and `max_bytes` of table pages bound the log; 0 turns that
        bound off."""
        self._s = store
        self._db = store.catalog_env.db["audit"]
        self._by = store.catalog_env.db["auditby"]
        self._seq = itertools.count()
        self._max_age = max_age
        self._max_bytes = max_bytes
        with store.catalog_env.read() as txn:
            indexed = store.counters.get(txn, INDEXED)
        if not indexed and store.writer.refusal() is None:
            store.writer.run(lambda w: self._index(w.catalog))

    def append(self, entry: AuditEntry) -> None:
        details = entry.details
        if len(json.dumps(details)) > MAX_DETAIL_BYTES:
            details = {"truncated": True, "keys": sorted(details)[:50]}
        raw = json.dumps({**entry.to_wire(), "details": details}, separators=(",", ":"))
        key = _KEY.pack(int(entry.at * 1000), next(self._seq) & 0xFFFFFFFF)
        age_floor = int((entry.at - self._max_age) * 1000) if self._max_age > 0 else 0
        oldest_kept = _KEY.pack(max(0, age_floor), 0)

        def write(txn: lmdb.Transaction) -> None:
            self._put(txn, key, entry.token, raw.encode())
            for _ in range(PRUNE_PER_APPEND):
                victim = self._victim(txn, oldest_kept)
                if victim is None or victim == key:
                    break  # never the entry just added, however small max_bytes is
                self._delete(txn, victim)

        self._s.writer.run(lambda w: write(w.catalog))

    def _victim(self, txn: lmdb.Transaction, oldest_kept: bytes) -> bytes | None:
        """The entry to prune next: the oldest if it is past `max_age`; while the log is
        over `max_bytes`, the oldest of the token holding the most bytes; else None."""
        cur = txn.cursor(db=self._db)
        if cur.first() and bytes(cur.key()) < oldest_kept:
            return bytes(cur.key())
        if not self._over(txn):
            return None
        sizes = self._s.counters.with_prefix(txn, BYTES_BY)
        if not sizes:
            return None
        biggest = max(sizes, key=lambda name: sizes[name]).encode() + b"\0"
        by = txn.cursor(db=self._by)
        if by.set_range(biggest) and bytes(by.key()).startswith(biggest):
            return bytes(by.key())[len(biggest) :]
        return None

    def _put(self, txn: lmdb.Transaction, key: bytes, token: str, raw: bytes) -> None:
        txn.put(key, raw, db=self._db)
        txn.put(token.encode() + b"\0" + key, b"", db=self._by)
        self._s.counters.add(txn, BYTES_BY + token, len(raw))

    def _delete(self, txn: lmdb.Transaction, key: bytes) -> None:
        raw = txn.get(key, db=self._db)
        if raw is None:
            return
        token = str(json.loads(bytes(raw)).get("token", "-"))
        txn.delete(key, db=self._db)
        txn.delete(token.encode() + b"\0" + key, db=self._by)
        self._s.counters.add(txn, BYTES_BY + token, -len(raw))

    def _index(self, txn: lmdb.Transaction) -> None:
        """Index a log written before `auditby` (once; a few hundred thousand entries at
        most, in one writer transaction at open)."""
        for key, raw in txn.cursor(db=self._db):
            token = str(json.loads(bytes(raw)).get("token", "-"))
            txn.put(token.encode() + b"\0" + bytes(key), b"", db=self._by)
            self._s.counters.add(txn, BYTES_BY + token, len(raw))
        self._s.counters.add(txn, INDEXED, 1)

    def _over(self, txn: lmdb.Transaction) -> bool:
        return self._max_bytes > 0 and _table_bytes(txn, self._db) > self._max_bytes

    def usage(self) -> tuple[int, int]:
        """Entries and bytes of pages the log takes in the catalog (what `max_bytes`
        bounds)."""
        with self._s.catalog_env.read() as txn:
            return int(txn.stat(self._db)["entries"]), _table_bytes(txn, self._db)

    def entries(
        self, limit: int = 100, before: str | None = None
    ) -> tuple[list[AuditEntry], str | None]:
        """Newest first, strictly before the cursor `before`; returns the entries and the
        cursor of the next page (None at the oldest)."""
        if not 1 <= limit <= MAX_LIST:
            raise InvalidRequest(f"limit must be 1 to {MAX_LIST}")
        try:
            start = bytes.fromhex(before) if before is not None else None
        except ValueError:
            raise InvalidRequest("before must be a cursor from a previous page") from None
        out: list[AuditEntry] = []
        last = b""
        with self._s.catalog_env.read() as txn:
            cur = txn.cursor(db=self._db)
            # the last key before `start`: one back from the first at or after it
            found = start is not None and cur.set_range(start)
            ok = cur.prev() if found else cur.last()
            while ok and len(out) < limit:
                last = bytes(cur.key())
                out.append(AuditEntry(**json.loads(bytes(cur.value()))))
                ok = cur.prev()
            more = ok
        return out, (last.hex() if more else None)


def _table_bytes(txn: lmdb.Transaction, db: lmdb._Database) -> int:
    """Bytes of the LMDB pages a table takes: what it costs the catalog and its backups."""
    st = txn.stat(db)
    return int(st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]) * int(st["psize"])
