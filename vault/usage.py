"""What a checkpoint or a namespace occupies at rest: stored against logical bytes, by codec
and by tier.

Computed from the catalog on request (a scan of the manifests involved), not kept as
running totals: a chunk shared by two checkpoints or namespaces counts in full for each
(what deleting one alone would not free), and bases kept only for a delta count with the
checkpoint whose delta needs them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

import lmdb

from checkpoint_vault.protocol import CodecShare, Usage

from .content.chunks import ChunkMeta, Chunks
from .content.location import Packed
from .content.reader import MAX_CHAIN
from .manifest import distinct_chunks
from .prune import live_records
from .records import StoredCheckpoint

if TYPE_CHECKING:
    from .catalog import Catalog
    from .content.chunks import Chunks


class UsageParts(Protocol):
    """What a usage scan reads: the catalog and the chunk table."""

    @property
    def catalog(self) -> Catalog: ...
    @property
    def chunks(self) -> Chunks: ...


def _add(usage: Usage, meta: ChunkMeta, depth: int) -> None:
    """Count one chunk (read through `depth` deltas) into `usage`."""
    usage.chunks += 1
    usage.stored_bytes += meta.stored
    share = usage.codecs.setdefault(meta.codec, CodecShare())
    share.chunks += 1
    share.bytes += meta.stored
    share.plain += meta.size
    tier = meta.where.tier if isinstance(meta.where, Packed) else "hot"
    usage.tiers[tier] = usage.tiers.get(tier, 0) + meta.stored
    usage.max_chain = max(usage.max_chain, depth)


def _measure(chunks: Chunks, txn: lmdb.Transaction, cids: Iterable[bytes], usage: Usage) -> None:
    seen: set[bytes] = set()
    for cid in cids:
        meta = chunks.meta(txn, cid)
        if meta is None or cid in seen:
            continue
        seen.add(cid)
        chain = chunks.chain(txn, cid, MAX_CHAIN) if meta.delta else [cid]
        _add(usage, meta, len(chain) - 1)
        for base in chain[1:]:  # bases no checkpoint references are kept for this one
            base_meta = chunks.meta(txn, base)
            if base_meta is not None and base_meta.refs == 0 and base not in seen:
                seen.add(base)
                _add(usage, base_meta, 0)


def checkpoint_usage(store: UsageParts, txn: lmdb.Transaction, rec: StoredCheckpoint) -> Usage:
    files = store.catalog.manifest(txn, rec.id)
    usage = Usage(logical_bytes=sum(f.size for f in files.values()))
    _measure(store.chunks, txn, sorted(distinct_chunks(files)), usage)
    return usage


def namespace_usage(store: UsageParts, txn: lmdb.Transaction, ns: str) -> Usage:
    usage = Usage()
    cids: set[bytes] = set()
    for rec in live_records(store.catalog, txn, ns):
        files = store.catalog.manifest(txn, rec.id)
        usage.logical_bytes += sum(f.size for f in files.values())
        cids |= distinct_chunks(files)
    _measure(store.chunks, txn, sorted(cids), usage)
    return usage
