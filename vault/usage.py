"""What a checkpoint or a namespace occupies at rest: stored against logical bytes, by codec
and by tier.

Computed from the catalog on request (a scan of the manifests involved), not kept as
running totals: a chunk shared by two checkpoints or namespaces counts in full for each
(what deleting one alone would not free), and bases kept only for a delta count with the
checkpoint whose delta needs them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import lmdb

from .content.chunks import ChunkMeta, Chunks
from .content.location import Packed
from .content.reader import MAX_CHAIN
from .manifest import distinct_chunks
from .prune import live_records
from .records import StoredCheckpoint
from .store import Store


@dataclass
class CodecShare:
    chunks: int = 0
    bytes: int = 0  # stored (frame) bytes
    plain: int = 0  # plaintext bytes


@dataclass
class Usage:
    logical_bytes: int = 0  # the files' sizes
    stored_bytes: int = 0  # frames at rest for the distinct chunks (and bases they need)
    chunks: int = 0
    max_chain: int = 0  # most deltas one read of these chunks decodes
    codecs: dict[str, CodecShare] = field(default_factory=dict)
    tiers: dict[str, int] = field(default_factory=dict)  # stored bytes by tier ("hot")

    def add(self, meta: ChunkMeta, depth: int) -> None:
        self.chunks += 1
        self.stored_bytes += meta.stored
        share = self.codecs.setdefault(meta.codec, CodecShare())
        share.chunks += 1
        share.bytes += meta.stored
        share.plain += meta.size
        tier = meta.where.tier if isinstance(meta.where, Packed) else "hot"
        self.tiers[tier] = self.tiers.get(tier, 0) + meta.stored
        self.max_chain = max(self.max_chain, depth)

    def to_wire(self) -> dict[str, object]:
        out = asdict(self)
        out["ratio"] = (
            round(self.logical_bytes / self.stored_bytes, 3) if self.stored_bytes else None
        )
        return out


def _measure(chunks: Chunks, txn: lmdb.Transaction, cids: Iterable[bytes], usage: Usage) -> None:
    seen: set[bytes] = set()
    for cid in cids:
        meta = chunks.meta(txn, cid)
        if meta is None or cid in seen:
            continue
        seen.add(cid)
        chain = chunks.chain(txn, cid, MAX_CHAIN) if meta.delta else [cid]
        usage.add(meta, len(chain) - 1)
        for base in chain[1:]:  # bases no checkpoint references are kept for this one
            base_meta = chunks.meta(txn, base)
            if base_meta is not None and base_meta.refs == 0 and base not in seen:
                seen.add(base)
                usage.add(base_meta, 0)


def checkpoint_usage(store: Store, txn: lmdb.Transaction, rec: StoredCheckpoint) -> Usage:
    files = store.catalog.manifest(txn, rec.id)
    usage = Usage(logical_bytes=sum(f.size for f in files.values()))
    _measure(store.chunks, txn, sorted(distinct_chunks(files)), usage)
    return usage


def namespace_usage(store: Store, txn: lmdb.Transaction, ns: str) -> Usage:
    usage = Usage()
    cids: set[bytes] = set()
    for rec in live_records(store, txn, ns):
        files = store.catalog.manifest(txn, rec.id)
        usage.logical_bytes += sum(f.size for f in files.values())
        cids |= distinct_chunks(files)
    _measure(store.chunks, txn, sorted(cids), usage)
    return usage
