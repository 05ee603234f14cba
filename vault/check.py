"""Consistency check: recompute every reference count from the manifests.

Runs in one read transaction, so it sees a single consistent catalog even while the service
keeps writing. Reports reference-count drift (of chunks, and of the stored file entries
manifests name: vault/entries.py; an entry's drift item has `entry` where a chunk's has
`chunk`), chunks a manifest needs but the store lacks (or holds damaged, or whose delta base
is gone), and orphans: stored chunks no manifest references and no delta needs as its base
(normal until GC has collected them). `repair` rewrites drifted counts in one writer
transaction, flags deltas whose base is gone as damaged (the next save of their bytes heals
them), and drops links of chunks no longer stored.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from checkpoint_vault.protocol import CheckReport, Drift, GcReport

from .content.chunks import ChunkMeta
from .content.location import HotFrame, Inline
from .gc import GcParts, delete_unreferenced
from .pacing import Pacer
from .writer import WriteTxn

if TYPE_CHECKING:
    from .catalog import Catalog
    from .env import Env


class CheckParts(GcParts, Protocol):
    """What a reference check needs of the store: the catalog it recounts from, the frames it
    checks, and what forgetting unreferenced chunks needs (`GcParts`, for `--repair`)."""

    @property
    def catalog(self) -> Catalog: ...
    @property
    def frames_env(self) -> Env: ...
    def now_ms(self) -> int: ...


def check(
    store: CheckParts, repair: bool = False, stop: threading.Event | None = None
) -> CheckReport:
    """Frames are listed first: a frame is durable before the metadata that names it, so
    any frame in that list whose chunk is committed appears in the later catalog view.
    `stop` is looked at every `RECOUNT_STEP` manifests of the recount and before repairs: a
    stopped check has changed nothing."""
    report = CheckReport()
    pacer = Pacer("check", None, stop)
    frame_seqs = store.chunks.hot_frame_seqs()
    expected: Counter[bytes] = Counter()
    stored: dict[bytes, ChunkMeta] = {}
    with store.catalog_env.read() as txn:
        report.checkpoints, expected, entries = store.catalog.expected_refs(txn, pacer.check)
        entry_drift = _entry_drift(store.catalog.entries.all_refs(txn), entries)
        stored = dict(store.chunks.all(txn))
        links = dict(store.chunks.delta_links(txn))
        report.domain_drift = store.catalog.nsrefs_drift(txn)
        # Packed chunks the catalog cannot place (it does not read the tiers: verify does).
        report.missing.extend(c.hex() for c, m in stored.items() if m.where is None)
        report.missing.extend(
            c.hex()
            for c, m in stored.items()
            if isinstance(m.where, Inline) and store.chunks.inline_frame(txn, c, m.where) is None
        )
    report.chunks = len(stored)
    hot = {m.where.seq for m in stored.values() if isinstance(m.where, HotFrame)}
    report.orphan_frames = len(frame_seqs - hot)
    unseen = [
        cid
        for cid, m in stored.items()
        if isinstance(m.where, HotFrame) and m.where.seq not in frame_seqs
    ]
    report.missing.extend(c.hex() for c in _still_without_frame(store, unseen))
    stale = [c for c in links if c not in stored]
    report.stale_links = len(stale)
    baseless = {c for c, base in links.items() if c in stored and base not in stored}
    needed = set(links.values())
    for cid in expected:
        meta = stored.get(cid)
        if meta is None or cid in baseless:
            report.missing.append(cid.hex())
        elif meta.damaged:
            report.damaged.append(cid.hex())
    report.drift.extend(entry_drift)
    for cid, meta in stored.items():
        want = expected.get(cid, 0)
        if meta.refs != want:
            report.drift.append(Drift(meta.refs, want, chunk=cid.hex()))
        if want == 0 and cid in needed:
            report.bases_kept += 1
        elif want == 0:
            report.orphans.append(cid.hex())
    pacer.check()
    if repair:
        _repair_all(store, report, stale, baseless, bool(entry_drift))
    return report


def _repair_all(
    store: CheckParts, report: CheckReport, stale: list[bytes], baseless: set[bytes], entries: bool
) -> None:
    if entries:
        report.repaired += _repair_entries(store)
    if report.domain_drift:
        report.repaired += store.writer.run(lambda w: store.catalog.build_nsrefs(w.catalog))
    if stale or baseless:
        report.repaired += _repair_links(store, stale, baseless)
    chunk_drift = {bytes.fromhex(d.chunk) for d in report.drift if d.chunk is not None}
    if chunk_drift:
        report.repaired += _repair(store, chunk_drift)
    if report.orphans:
        # Orphans no live upload reserved go now, without waiting out the GC grace period
        # (the recount above already settled that nothing references them).
        dropped = GcReport()
        delete_unreferenced(
            store, [bytes.fromhex(c) for c in report.orphans], store.now_ms(), 0, dropped
        )
        report.repaired += dropped.chunks_deleted
    if report.orphan_frames:
        report.repaired += _drop_orphan_frames(store)


def _still_without_frame(store: CheckParts, cids: list[bytes]) -> list[bytes]:
    """Of chunks whose frame was absent from the earlier frame list, those still absent now
    (a chunk written between the two views is fine)."""
    if not cids:
        return []
    with store.catalog_env.read() as txn:
        metas = {c: store.chunks.meta(txn, c) for c in cids}
    with store.frames_env.read() as txn:
        return [
            c
            for c, m in metas.items()
            if m is not None
            and isinstance(m.where, HotFrame)
            and store.chunks.hot_frame(txn, m.where) is None
        ]


def _repair(store: CheckParts, cids: set[bytes]) -> int:
    """Recount the drifted chunks inside the writer, against the catalog as it is now."""

    def op(w: WriteTxn) -> int:
        counts = store.catalog.expected_refs(w.catalog)[1]
        fixed = 0
        now_ms = store.now_ms()
        for cid in cids:
            meta = store.chunks.meta(w.catalog, cid)
            if meta is not None and meta.refs != counts[cid]:
                zero_since = (meta.zero_since_ms or now_ms) if counts[cid] == 0 else 0
                store.chunks.set_meta(
                    w.catalog, cid, meta._replace(refs=counts[cid], zero_since_ms=zero_since)
                )
                fixed += 1
        return fixed

    return store.writer.run(op)


def _repair_links(store: CheckParts, stale: list[bytes], baseless: set[bytes]) -> int:
    def op(w: WriteTxn) -> int:
        for cid in stale:
            store.chunks.drop_stale_link(w.catalog, cid)
        for cid in baseless:
            store.chunks.mark_damaged(w.catalog, cid)
        return len(stale) + len(baseless)

    return store.writer.run(op)


def _entry_drift(stored: Iterator[tuple[bytes, int]], expected: Counter[bytes]) -> list[Drift]:
    have = dict(stored)
    return [
        Drift(have.get(d, 0), expected.get(d, 0), entry=d.hex())
        for d in sorted(set(have) | set(expected))
        if have.get(d, 0) != expected.get(d, 0)
    ]


def _repair_entries(store: CheckParts) -> int:
    """Recount entry references inside the writer (chunk counts are recounted after, from
    the entries that remain)."""

    def op(w: WriteTxn) -> int:
        expected = store.catalog.expected_refs(w.catalog)[2]
        have = dict(store.catalog.entries.all_refs(w.catalog))
        fixed = 0
        for digest in set(have) | set(expected):
            if have.get(digest, 0) != expected.get(digest, 0):
                store.catalog.entries.set_refs(
                    w.catalog, digest, expected.get(digest, 0), store.now_ms()
                )
                fixed += 1
        return fixed

    return store.writer.run(op)


def _drop_orphan_frames(store: CheckParts) -> int:
    """Delete frames no chunk metadata names (left by a crash between the two commits of a
    write batch), judged inside the writer where no batch is half done."""
    return int(store.writer.run(store.chunks.drop_unnamed_frames))
