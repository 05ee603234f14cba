"""Consistency check: recompute every reference count from the manifests.

Runs in one read transaction, so it sees a single consistent catalog even while the service
keeps writing. Reports reference-count drift, chunks a manifest needs but the store lacks
(or holds damaged), and orphans: stored chunks no manifest references (normal until GC has
collected them). `repair` rewrites drifted counts in one writer transaction.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

import lmdb

from .blocks import ChunkMeta
from .manifest import distinct_chunks
from .store import Store


@dataclass
class CheckReport:
    checkpoints: int = 0
    chunks: int = 0
    drift: list[dict[str, object]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    damaged: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    repaired: int = 0

    @property
    def ok(self) -> bool:
        return not (self.drift or self.missing or self.damaged)


def check(store: Store, repair: bool = False) -> CheckReport:
    report = CheckReport()
    expected: Counter[bytes] = Counter()
    with store.env.read() as txn:
        for _, files in store.catalog.all_manifests(txn):
            report.checkpoints += 1
            expected.update(distinct_chunks(files))
        stored: dict[bytes, ChunkMeta] = {}
        for key, raw in txn.cursor(db=store.env.db["chunkmeta"]):
            cid = bytes(key)
            stored[cid] = ChunkMeta.unpack(raw)
            if store.blocks.frame(txn, cid) is None:
                report.missing.append(cid.hex())
    report.chunks = len(stored)
    for cid, _n in expected.items():
        meta = stored.get(cid)
        if meta is None:
            report.missing.append(cid.hex())
        elif meta.damaged:
            report.damaged.append(cid.hex())
    for cid, meta in stored.items():
        want = expected.get(cid, 0)
        if meta.refs != want:
            report.drift.append({"chunk": cid.hex(), "refs": meta.refs, "expected": want})
        if want == 0:
            report.orphans.append(cid.hex())
    if repair and report.drift:
        report.repaired = _repair(store, {bytes.fromhex(str(d["chunk"])) for d in report.drift})
    return report


def _repair(store: Store, cids: set[bytes]) -> int:
    """Recount the drifted chunks inside the writer, against the catalog as it is now."""

    def op(txn: lmdb.Transaction) -> int:
        counts: Counter[bytes] = Counter()
        for _, files in store.catalog.all_manifests(txn):
            counts.update(c for c in distinct_chunks(files) if c in cids)
        fixed = 0
        now_ms = store.now_ms()
        for cid in cids:
            meta = store.blocks.meta(txn, cid)
            if meta is not None and meta.refs != counts[cid]:
                zero_since = (meta.zero_since_ms or now_ms) if counts[cid] == 0 else 0
                store.blocks.set_meta(
                    txn, cid, replace(meta, refs=counts[cid], zero_since_ms=zero_since)
                )
                fixed += 1
        return fixed

    return store.writer.run(op)
