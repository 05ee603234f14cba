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
"""

from __future__ import annotations

import itertools
import json
import struct

from protocol import AuditEntry

from .errors import InvalidRequest
from .store import Store

_KEY = struct.Struct(">QI")
MAX_LIST = 1000
MAX_DETAIL_BYTES = 2048  # of the request body summary kept per entry


class AuditLog:
    def __init__(self, store: Store) -> None:
        self._s = store
        self._db = store.catalog_env.db["audit"]
        self._seq = itertools.count()

    def append(self, entry: AuditEntry) -> None:
        details = entry.details
        if len(json.dumps(details)) > MAX_DETAIL_BYTES:
            details = {"truncated": True, "keys": sorted(details)[:50]}
        raw = json.dumps({**entry.to_wire(), "details": details}).encode()
        key = _KEY.pack(int(entry.at * 1000), next(self._seq) & 0xFFFFFFFF)
        self._s.writer.run(lambda w: w.catalog.put(key, raw, db=self._db))

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
