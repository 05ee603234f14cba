"""Dedup domains: which namespaces reference each chunk, so that dedup answers per caller.

A vault that tells any writer "I already have this chunk" is a confirmation oracle: a file
under one chunk (every file under the minimum chunk size) has file hash = chunk id, so a
tenant could guess another tenant's small secret (a config with a 4-digit PIN: 10,000
guesses in one `missing` query) and, by committing the id it never sent, read it (Harnik
et al. 2010, "Side channels in cloud services"; Halevi et al. 2011, "Proofs of ownership").

So a stored chunk counts as present for a caller only inside its *domain*: the chunk is
referenced by a live checkpoint of a namespace the caller may read or write (a write-only
producer keeps its incremental saves), or this upload session sent its bytes. Anywhere
else the caller must send the bytes, which proves it holds them; they are stored once all
the same, so stored bytes and the dedup ratio do not change, only bytes on the wire.

The index is `chunk id (32 bytes) + namespace -> u32 count of live checkpoints of that
namespace referencing the chunk`, kept in the transaction that changes the global counts
(Catalog.add / Catalog.remove). Keyed by chunk first, so "who references this chunk" is one
cursor seek, and most chunks have one or two namespaces.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Mapping

import lmdb

from .env import Env
from .manifest import FileEntry, distinct_chunks

# May the caller reference chunks of this namespace? None: everything (admin, offline tools).
Domain = Callable[[str], bool] | None

_COUNT = struct.Struct("<I")
_ID = 32
NSREFS_BUILT = "nsrefs_built"  # counter: 1 once the index covers every live checkpoint


class NamespaceRefs:
    def __init__(self, env: Env) -> None:
        self._db = env.db["nsrefs"]
        self._records = env.db["checkpoints"]
        self._manifests = env.db["manifests"]

    def add(self, txn: lmdb.Transaction, ns: str, cids: Iterable[bytes], delta: int) -> None:
        """Change `ns`'s count for each chunk (writer thread, with the global counts)."""
        suffix = ns.encode()
        for cid in cids:
            key = cid + suffix
            raw = txn.get(key, db=self._db)
            count = (_COUNT.unpack(raw)[0] if raw is not None else 0) + delta
            if count > 0:
                txn.put(key, _COUNT.pack(count), db=self._db)
            elif raw is not None:
                txn.delete(key, db=self._db)

    def namespaces(self, txn: lmdb.Transaction, cid: bytes) -> Iterator[str]:
        """The namespaces with a live checkpoint referencing `cid`."""
        cur = txn.cursor(db=self._db)
        if not cur.set_range(cid):
            return
        for key in cur.iternext(values=False):
            key = bytes(key)
            if key[:_ID] != cid:
                return
            yield key[_ID:].decode()

    def visible(self, txn: lmdb.Transaction, cid: bytes, domain: Domain) -> bool:
        """Is `cid` referenced inside `domain`? (Callers check the chunk is stored.)"""
        return domain is None or any(domain(ns) for ns in self.namespaces(txn, cid))

    def drift(
        self, txn: lmdb.Transaction, live: Iterable[tuple[str, Mapping[str, FileEntry]]]
    ) -> int:
        """How many index entries differ from a recount of `live` (namespace, files)."""
        expected: dict[bytes, int] = {}
        for ns, files in live:
            suffix = ns.encode()
            for cid in distinct_chunks(files):
                expected[cid + suffix] = expected.get(cid + suffix, 0) + 1
        stored = {bytes(k): _COUNT.unpack(v)[0] for k, v in txn.cursor(db=self._db)}
        return sum(stored.get(k) != expected.get(k) for k in stored.keys() | expected.keys())

    def build(
        self, txn: lmdb.Transaction, live: Iterable[tuple[str, Mapping[str, FileEntry]]]
    ) -> int:
        """Index every live checkpoint, given as (namespace, files) (catalogs written before
        the index existed, or restored from such a backup); returns how many it read."""
        txn.drop(self._db, delete=False)
        n = 0
        for ns, files in live:
            self.add(txn, ns, distinct_chunks(files), +1)
            n += 1
        return n


def cached(domain: Domain) -> Domain:
    """`domain` with its answers remembered (scope globs are matched once per namespace)."""
    if domain is None:
        return None
    seen: dict[str, bool] = {}

    def check(ns: str) -> bool:
        if ns not in seen:
            seen[ns] = domain(ns)
        return seen[ns]

    return check
