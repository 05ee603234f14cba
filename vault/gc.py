"""Garbage collection: expired upload sessions and idempotency keys, then chunks nothing references.

A chunk is collected only when its reference count is zero, has been zero for the grace
period, no live upload reserved it, and no stored delta needs it as its base (a base is
kept for its dependents; compaction re-encodes deltas whose base only they still hold).
Collecting a delta may free its base: the same run then looks at those bases again, down
the chain, instead of leaving one link per run (a compacted series whose older checkpoints
were all deleted took up to 8 GC runs to leave the disk; issue 32). Candidates are found by a
scan outside the writer; each one is re-checked inside the writer transaction that deletes
it, so a commit or a missing query that lands in between always wins.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

from checkpoint_vault.protocol import GcReport

from .content.chunks import ChunkMeta
from .idempotency import IdempotencyKeys
from .pacing import Pacer
from .store import Store
from .uploads import Uploads
from .writer import WriteTxn

if TYPE_CHECKING:
    from .content.chunks import Chunks
    from .env import Env
    from .writer import Writer


class GcParts(Protocol):
    """What forgetting unreferenced chunks needs of the store (also `check --repair`'s);
    `collect` takes the whole store, which the idempotency keys it expires are kept in."""

    @property
    def catalog_env(self) -> Env: ...
    @property
    def chunks(self) -> Chunks: ...
    @property
    def writer(self) -> Writer: ...


DELETE_BATCH = 2048


def _collectable(meta: ChunkMeta, now_ms: int, grace_ms: int) -> bool:
    return (
        meta.refs == 0
        and meta.zero_since_ms + grace_ms <= now_ms
        and meta.reserved_until_ms <= now_ms
    )


def _is_base(store: GcParts, cid: bytes) -> bool:
    with store.catalog_env.read() as txn:
        return store.chunks.has_dependents(txn, cid)


def collect(
    store: Store, uploads: Uploads, dry_run: bool = False, stop: threading.Event | None = None
) -> GcReport:
    """`stop` set (SIGTERM): stop before the next batch (`MaintenanceStopped`); each batch
    committed on its own, so what was collected stays collected and the rest waits for
    the next run."""
    pacer = Pacer("gc", None, stop)
    report = GcReport(dry_run=dry_run)
    if not dry_run:
        report.uploads_expired = uploads.expire()
        keys = IdempotencyKeys(store)
        report.keys_expired = store.writer.run(lambda w: keys.expire(w.catalog, store.clock.now()))
    now_ms = store.now_ms()
    grace_ms = int(store.config.gc_grace * 1000)
    batch: list[bytes] = []
    freed: list[bytes] = []  # bases of the deltas collected
    for key, meta in store.chunks.scan():
        if not _collectable(meta, now_ms, grace_ms) or _is_base(store, key):
            continue
        if dry_run:
            report.chunks_deleted += 1
            report.bytes_freed += meta.stored
            continue
        batch.append(key)
        if len(batch) >= DELETE_BATCH:
            pacer.check()
            freed += delete_unreferenced(store, batch, now_ms, grace_ms, report)
            batch = []
    if batch:
        pacer.check()
        freed += delete_unreferenced(store, batch, now_ms, grace_ms, report)
    pacer.check()
    _collect_freed_bases(store, freed, now_ms, grace_ms, report)
    return report


def _collect_freed_bases(
    store: GcParts, freed: list[bytes], now_ms: int, grace_ms: int, report: GcReport
) -> None:
    """The bases of the deltas this run collected (`freed`), when nothing else holds them
    now: a level of the chains at a time (chains are at most MAX_CHAIN long)."""
    while freed:
        with store.catalog_env.read() as txn:
            ready = []
            for cid in sorted(set(freed)):
                meta = store.chunks.meta(txn, cid)
                if (
                    meta is not None
                    and _collectable(meta, now_ms, grace_ms)
                    and not store.chunks.has_dependents(txn, cid)
                ):
                    ready.append(cid)
        freed = []
        for start in range(0, len(ready), DELETE_BATCH):
            part = ready[start : start + DELETE_BATCH]
            freed += delete_unreferenced(store, part, now_ms, grace_ms, report)


def delete_unreferenced(
    store: GcParts, cids: list[bytes], now_ms: int, grace_ms: int, report: GcReport
) -> list[bytes]:
    """Unreference before delete: drop the metadata in one batch, the frames in the next.
    The bases of the deltas it collected (which may be free now)."""

    def forget(w: WriteTxn) -> tuple[list[ChunkMeta], list[bytes]]:
        gone, bases = [], []
        for cid in cids:
            meta = store.chunks.meta(w.catalog, cid)
            if (
                meta is not None
                and _collectable(meta, now_ms, grace_ms)
                and not store.chunks.has_dependents(w.catalog, cid)
            ):
                base = store.chunks.base_of(w.catalog, cid)
                if base is not None:
                    bases.append(base)
                store.chunks.forget(w.catalog, cid, meta)
                gone.append(meta)
        return gone, bases

    gone, bases = store.writer.run(forget, size=len(cids) * 64)
    places = [m.where for m in gone if m.hot]
    if places:
        store.writer.run(lambda w: store.chunks.drop_hot_frames(w.frames, places))
    report.chunks_deleted += len(gone)
    report.bytes_freed += sum(m.stored for m in gone)
    return bases
