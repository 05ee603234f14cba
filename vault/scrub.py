"""Verification (scrub): re-read chunks, find the damaged ones, invalidate and heal.

A damaged chunk is flagged (so the missing query reports it and the next upload of the same
bytes replaces it), and every live checkpoint that uses it becomes `invalid` with reason
`corrupt chunk <id>` and source `scrub`, remembering the state it replaced. When a later
verify finds all chunks of such a checkpoint sound again, it restores that state; a
checkpoint a producer marked invalid is never touched. Reading is paced to a byte rate so a
background scrub never starves producers.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from checkpoint_vault.protocol import VerifyReport

from .content.chunks import ChunkMeta
from .content.parts import ContentParts
from .content.reader import Reader
from .manifest import distinct_chunks
from .pacing import Pacer
from .prune import live_records
from .records import Validity
from .writer import WriteTxn

if TYPE_CHECKING:
    from .catalog import Catalog
    from .clock import Clock


class ScrubParts(ContentParts, Protocol):
    """What a scrub needs of the store: reading chunks (`ContentParts`), the catalog whose
    checkpoints it marks invalid, and the clock for the mark."""

    @property
    def catalog(self) -> Catalog: ...
    @property
    def clock(self) -> Clock: ...


BATCH = 256


def verify(
    store: ScrubParts,
    namespace: str | None = None,
    sample: float = 1.0,
    rate: float | None = None,
    seed: int | None = None,
    stop: threading.Event | None = None,
) -> VerifyReport:
    """Check chunks (all, a namespace's, or a random `sample` fraction) at most `rate` B/s;
    `stop` set (the server is shutting down): stop at the next batch with
    `MaintenanceStopped`. Damage found before the stop is not settled: the next run finds
    it again."""
    report = VerifyReport()
    start = time.monotonic()
    pacer = Pacer("verify", rate, stop)
    rng = random.Random(seed)
    damaged: list[bytes] = []
    batch: list[bytes] = []
    for cid in _candidates(store, namespace):
        if sample < 1.0 and rng.random() >= sample:
            continue
        batch.append(cid)
        if len(batch) >= BATCH:
            damaged += _check_batch(store, batch, report)
            batch = []
            pacer.pace(report.bytes_checked)
    damaged += _check_batch(store, batch, report)
    report.corrupt = [c.hex() for c in damaged]
    invalidated, healed = store.writer.run(lambda w: _settle(store, w, damaged))
    report.checkpoints_invalidated, report.checkpoints_healed = invalidated, healed
    report.seconds = time.monotonic() - start
    return report


def _candidates(store: ScrubParts, namespace: str | None) -> Iterable[bytes]:
    if namespace is None:
        return (key for key, _ in store.catalog_env.scan("chunkmeta"))
    with store.catalog_env.read() as txn:
        store.catalog.require_namespace(txn, namespace)
        chunks: set[bytes] = set()
        for rec in live_records(store.catalog, txn, namespace):
            if rec.durable:  # not adopted yet: its chunks are not here to verify
                chunks |= distinct_chunks(store.catalog.manifest(txn, rec.id))
    return sorted(chunks)


def _check_batch(store: ScrubParts, cids: list[bytes], report: VerifyReport) -> list[bytes]:
    reader = Reader(store)
    metas, frames = reader.frames(cids)
    plain, damaged = reader.decoded(cids, metas, frames)  # a delta decodes its whole chain
    for meta in metas:
        if meta is not None:  # else collected since the scan
            report.chunks_checked += 1
            report.bytes_checked += meta.stored
    # A delta flagged only because its base was damaged reads again once the base healed.
    sound_again = [
        c for c, m, p in zip(cids, metas, plain, strict=True) if m and m.damaged and p is not None
    ]
    if sound_again:
        store.writer.run(lambda w: store.chunks.clear_damaged(w.catalog, sound_again))
    return sorted(damaged)


def _settle(store: ScrubParts, w: WriteTxn, damaged: list[bytes]) -> tuple[list[str], list[str]]:
    """Flag damaged chunks, invalidate the checkpoints using them, heal the ones whose
    chunks are all sound again. One writer transaction: one consistent view."""
    bad: set[bytes] = set()
    for cid in damaged:
        bad.update(store.chunks.mark_damaged(w.catalog, cid))  # and what depends on it
    now = store.clock.now()
    invalidated: list[str] = []
    healed: list[str] = []
    for ckpt_id, files in store.catalog.all_manifests(w.catalog):
        rec = store.catalog.record(w.catalog, ckpt_id)
        if rec is None or rec.is_tombstone:
            continue
        chunks = distinct_chunks(files)
        hit = sorted(bad & chunks)
        if hit and rec.validity.state != "invalid":
            rec.validity = Validity(
                "invalid",
                f"corrupt chunk {hit[0].hex()}",
                "scrub",
                now,
                previous=rec.validity.state,
            )
            store.catalog.put_record(w.catalog, rec)
            invalidated.append(rec.id)
        elif (
            not hit
            and rec.validity.state == "invalid"
            and rec.validity.source == "scrub"
            and _all_sound(store, w, chunks)
        ):
            rec.validity = Validity(rec.validity.previous or "unverified", "healed", "scrub", now)
            store.catalog.put_record(w.catalog, rec)
            healed.append(rec.id)
    return invalidated, healed


def _all_sound(store: ScrubParts, w: WriteTxn, chunks: set[bytes]) -> bool:
    metas: list[ChunkMeta | None] = [store.chunks.meta(w.catalog, c) for c in chunks]
    return all(m is not None and not m.damaged for m in metas)
