"""Commits of parts not adopted yet: the catalog's `pending` table (issue 44, M2).

A commit of parts that does not wait for shipping makes its checkpoint visible at once,
`durable: false`, before the owner holds the chunks its files name. Such a checkpoint has
a record, an index entry and tags like any other, but no row in `manifests`: its files
(with the parts that hold them) are a row here instead, so no reference count, entry or
dedup-domain count ever names a chunk the owner does not have. `Catalog.manifest` answers
these files, which keeps every path that reads a manifest safe by construction: one that
makes a checkpoint from them (fork, inherit, a parent's files) goes through `create`,
which refuses chunks not stored here (`missing_chunks`); one that looks chunks up
(tiering, compaction, usage, GC) finds none and skips them; reads of its files are
served from the part's node (api/cluster/durable.py), scrub and `verify` skip it.

Adoption (vault/durable.py) writes the manifest and its references, flips the record to
durable and drops the row, in one writer transaction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import lmdb

from .manifest import FileEntry


@dataclass(frozen=True)
class Pending:
    """A checkpoint's files before adoption, and where each file's bytes are."""

    namespace: str
    parts: list[tuple[str, str]]  # (node URL, "" for this process; part id), as committed
    files: dict[str, FileEntry]
    held_by: dict[str, int]  # file name -> index in `parts`

    def encode(self) -> bytes:
        files = {
            name: [e.size, e.hash.hex(), [[c.hex(), n] for c, n in e.chunks], self.held_by[name]]
            for name, e in self.files.items()
        }
        return json.dumps(
            {"namespace": self.namespace, "parts": self.parts, "files": files},
            separators=(",", ":"),
        ).encode()

    @staticmethod
    def decode(raw: bytes | memoryview) -> Pending:
        d = json.loads(bytes(raw))
        files, held_by = {}, {}
        for name, (size, digest, chunks, part) in d["files"].items():
            files[name] = FileEntry(
                size, bytes.fromhex(digest), tuple((bytes.fromhex(c), n) for c, n in chunks)
            )
            held_by[name] = part
        parts = [(str(node), str(pid)) for node, pid in d["parts"]]
        return Pending(d["namespace"], parts, files, held_by)

    def part_of(self, name: str) -> tuple[str, str] | None:
        i = self.held_by.get(name)
        return None if i is None else self.parts[i]


class PendingTable:
    """Rows of the `pending` table, keyed by checkpoint id (few: one per commit whose
    parts are still shipping)."""

    def __init__(self, db: lmdb._Database) -> None:
        self._db = db

    def get(self, txn: lmdb.Transaction, ckpt_id: str) -> Pending | None:
        raw = txn.get(ckpt_id.encode(), db=self._db)
        return None if raw is None else Pending.decode(raw)

    def put(self, txn: lmdb.Transaction, ckpt_id: str, pending: Pending) -> None:
        txn.put(ckpt_id.encode(), pending.encode(), db=self._db)

    def drop(self, txn: lmdb.Transaction, ckpt_id: str) -> None:
        txn.delete(ckpt_id.encode(), db=self._db)

    def ids(self, txn: lmdb.Transaction) -> list[str]:
        with txn.cursor(db=self._db) as cur:
            return [bytes(k).decode() for k in cur.iternext(keys=True, values=False)]


__all__ = ["Pending", "PendingTable"]
