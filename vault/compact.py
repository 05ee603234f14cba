"""Compaction: older checkpoints re-encoded into smaller frames, off the save path.

Saving stores chunks as they come (raw, or zstd where that pays); a checkpoint that changed
every float a little shares no chunk with its parent, yet differs from it in few bits.
Compaction finds those bits later, in the background or under `ckpt compact`:

- **Reverse deltas.** A checkpoint is compacted against its successor, the next newer live
  checkpoint of its namespace: each of its chunks is paired with the chunk at the same
  place of the same file in the successor, matched by offset and length, counted from the
  start of the file and then from its end (so a header that grew does not unmatch every
  tensor after it), and re-encoded as the cheapest of: a delta (XOR, byte grouping, zstd;
  vault/frame.py) against that chunk, a delta against the whole chunk that one's chain
  ends at (usually the newest checkpoint's), or byte-grouped whole. Cheapest is size plus
  DEPTH_COST per delta a read then decodes. The newest checkpoint is never touched, so
  restoring it reads what ingest wrote; older ones pay a few decodes.
- **Keyframes.** No read decodes more than MAX_CHAIN deltas: a chunk joins a chain only if
  its deepest dependent then stays within the bound. When its own dependents are in the
  way (compacting after every save deepens every older chain by one), they are re-rooted
  onto the chain's whole end first; otherwise it is a delta against that end, or
  byte-grouped whole, and starts a new chain.
- **Bases.** A delta keeps its base alive (GC asks the chunk table), whatever happens to the
  checkpoint the base came from. A delta whose base is kept only for it (no checkpoint
  references the base any more, after retention) is encoded again against the current
  successor, or whole, so the base can go.
- **Safety.** Frames are read and verified through the one read path, encoded on this
  thread, and switched in writer transactions that re-check each chunk is where it was
  read and its base is still sound; the frames left behind are dropped only after the switch
  commits. A crash at any point leaves every chunk readable (at worst an unnamed new frame,
  which the next open drops).

`compacted` remembers the successor each checkpoint was compacted against, so a run only
does new work.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import lmdb

from checkpoint_vault.protocol import CompactReport

from .content.chunks import ChunkMeta
from .content.location import HotFrame, Inline
from .content.parts import ContentParts
from .content.reader import MAX_CHAIN, Reader
from .env import TRIM_EVERY_BYTES
from .frame import Recoder, delta_base
from .manifest import FileEntry, distinct_chunks
from .names import PARTS
from .pacing import Pacer
from .writer import WriteTxn

if TYPE_CHECKING:
    from .catalog import Catalog


class CompactParts(ContentParts, Protocol):
    """What compaction needs of the store: reading chunks (`ContentParts`) and the catalog
    whose checkpoints it walks."""

    @property
    def catalog(self) -> Catalog: ...


MIN_CHUNK = 4096  # smaller chunks save too little to be worth a frame of their own
MIN_SAVING_FRACTION = 16  # keep a new frame only if it saves >= 1/16 of the stored bytes
# What one more delta to decode on every read of a chunk is worth, as a fraction of its
# stored size: a delta against a chunk 5 saves older that is within 5% of the size of one
# against the next is preferred, so dense updates (where distance barely matters) get
# short chains and sparse ones (where it does) get small deltas.
DEPTH_COST = 0.05
# Plaintext read, encoded and switched per writer transaction. A batch's frames and bases
# are read through LMDB's map before the mapping is trimmed (vault/env.py note_io), so the
# server's peak RSS follows it: 8 MiB gave a VmHWM of 289 MiB on the embedding series
# (bench/bench_du.py), 4 MiB 251 MiB; 2 MiB no less (issue 32: under 300 MiB).
BATCH_BYTES = 4 << 20


@dataclass(frozen=True)
class _Job:
    cid: bytes
    meta: ChunkMeta
    bases: tuple[tuple[bytes, int], ...]  # bases it may delta against, each with its depth


Progress = Callable[[CompactReport], None]


def compact(
    store: CompactParts,
    namespace: str | None = None,
    rate: float | None = None,
    progress: Progress | None = None,
    stop: threading.Event | None = None,
) -> CompactReport:
    """Compact every checkpoint (of one namespace, or all) not yet compacted against its
    current successor, reading at most `rate` plaintext bytes per second; `stop` set (the
    server is shutting down): stop at the next batch with `MaintenanceStopped`."""
    report = CompactReport()
    started, cpu = time.monotonic(), time.process_time()
    pacer = Pacer("compact", rate, stop)
    reader = Reader(store)
    recoder = Recoder()
    for ns, older, newer, head in _pairs(store, namespace):
        if ns not in report.namespaces:
            report.namespaces.append(ns)
        pacer.check()
        _compact_one(store, reader, recoder, older, newer, head, report, pacer)
        report.checkpoints += 1
        if progress is not None:
            progress(report)
    _forget_stale_marks(store)
    report.seconds = time.monotonic() - started
    report.cpu_seconds = time.process_time() - cpu
    return report


def _pairs(store: CompactParts, namespace: str | None) -> Iterator[tuple[str, str, str, str]]:
    """(namespace, checkpoint, its successor, the newest) for each checkpoint with work."""
    table = store.catalog_env.db["compacted"]
    with store.catalog_env.read() as txn:
        if namespace is not None:
            store.catalog.require_namespace(txn, namespace)
            names = [namespace]
        else:
            # not parts (vault/parts.py): a delta frame cannot go to the shared tier
            names = [n.name for n in store.catalog.namespaces(txn) if n.name != PARTS]
        todo = []
        for ns in names:
            ids = list(store.catalog.ids(txn, ns))  # newest first
            for newer, older in zip(ids, ids[1:], strict=False):
                mark = txn.get(older.encode(), db=table)
                if mark is None or bytes(mark).decode() != newer:
                    todo.append((ns, older, newer, ids[0]))
    yield from todo


def _forget_stale_marks(store: CompactParts) -> None:
    """Drop the marks of checkpoints deleted since they were compacted."""
    table = store.catalog_env.db["compacted"]

    def op(w: WriteTxn) -> None:
        stale = [
            bytes(k)
            for k, _ in w.catalog.cursor(db=table)
            if store.catalog.record(w.catalog, bytes(k).decode()) is None
        ]
        for key in stale:
            w.catalog.delete(key, db=table)

    store.writer.run(op)


def align(old: Mapping[str, FileEntry], new: Mapping[str, FileEntry]) -> dict[bytes, bytes]:
    """Chunk of `old` -> the chunk at the same place of the same file in `new` (same offset
    and length from the file's start, or else from its end). Files are matched by name, or
    a lone file with a lone file whatever their names."""
    if not set(old) & set(new) and len(old) == len(new) == 1:
        old = {"": next(iter(old.values()))}
        new = {"": next(iter(new.values()))}
    pairs: dict[bytes, bytes] = {}
    for name, entry in old.items():
        other = new.get(name)
        if other is None:
            continue
        from_start: dict[tuple[int, int], bytes] = {}
        from_end: dict[tuple[int, int], bytes] = {}
        for offset, cid, n in _offsets(other):
            from_start[(offset, n)] = cid
            from_end[(other.size - offset, n)] = cid
        for offset, cid, n in _offsets(entry):
            match = from_start.get((offset, n)) or from_end.get((entry.size - offset, n))
            if match is not None and match != cid:
                pairs.setdefault(cid, match)
    return pairs


def _offsets(entry: FileEntry) -> Iterator[tuple[int, bytes, int]]:
    offset = 0
    for cid, n in entry.chunks:
        yield offset, cid, n
        offset += n


def _compact_one(
    store: CompactParts,
    reader: Reader,
    recoder: Recoder,
    older: str,
    newer: str,
    head: str,
    report: CompactReport,
    pacer: Pacer,
) -> None:
    reroots, jobs = _plan(store, older, newer, head)
    for group in (reroots, jobs):  # dependents move off a chunk before it joins a chain
        batch: list[_Job] = []
        size = 0
        for job in group:
            batch.append(job)
            size += job.meta.size
            if size >= BATCH_BYTES:
                _run_batch(store, reader, recoder, batch, report)
                pacer.pace(report.bytes_read)
                batch, size = [], 0
        _run_batch(store, reader, recoder, batch, report)

    def mark(w: WriteTxn) -> None:
        if store.catalog.record(w.catalog, older) is not None:
            table = store.catalog_env.db["compacted"]
            w.catalog.put(older.encode(), newer.encode(), db=table)

    store.writer.run(mark)


def _plan(store: CompactParts, older: str, newer: str, head: str) -> tuple[list[_Job], list[_Job]]:
    """The chunks of `older` worth encoding again, each with the bases it may use: the
    chunk at its place in the successor, and the whole chunk that one's chain ends at (in
    the newest checkpoint, usually). Chunks the successor or the newest checkpoint share
    are left as they are: restoring the newest reads exactly what ingest wrote.

    Also the re-roots that go first: when a chunk's own dependents are what keeps it out of
    its successor's chain (compacting after every save deepens every older chain by one),
    those dependents are encoded again against the chain's whole end, so the chunk can
    join instead of becoming a keyframe (a delta from further away is still a small
    fraction of a whole frame)."""
    chunks = store.chunks
    with store.catalog_env.read() as txn:
        if store.catalog.record(txn, older) is None or store.catalog.record(txn, newer) is None:
            return [], []  # deleted since the work was listed
        old_files = store.catalog.manifest(txn, older)
        new_files = store.catalog.manifest(txn, newer)
        keep = distinct_chunks(new_files) | distinct_chunks(store.catalog.manifest(txn, head))
        pairs = align(old_files, new_files)
        reroots: dict[bytes, _Job] = {}
        jobs: list[_Job] = []
        for cid in sorted(distinct_chunks(old_files) - keep):
            meta = chunks.meta(txn, cid)
            if meta is None or meta.damaged or meta.size < MIN_CHUNK:
                continue
            if not isinstance(meta.where, (HotFrame, Inline)):
                continue  # in another tier: left where it is
            if meta.delta and not _base_orphaned(store, txn, cid):
                continue  # already a delta against a chunk some checkpoint still uses
            partner = pairs.get(cid)
            bases = _bases(store, txn, cid, partner)
            if partner is not None and partner not in dict(bases):
                moved = _reroots(store, txn, cid, partner)
                if moved is not None:
                    reroots.update(moved)
                    bases = _bases(store, txn, cid, partner, height=0)
            if not bases and meta.codec == "grouped":
                continue  # a keyframe already
            jobs.append(_Job(cid, meta, bases))
    return list(reroots.values()), jobs


def _reroots(
    store: CompactParts, txn: lmdb.Transaction, cid: bytes, partner: bytes
) -> dict[bytes, _Job] | None:
    """Jobs moving `cid`'s dependents onto the whole end of `partner`'s chain, if that is
    what would let `cid` chain onto `partner`; else None."""
    chunks = store.chunks
    root = chunks.chain(txn, partner, MAX_CHAIN)[-1]
    if _depth_through(store, txn, cid, partner, height=0) is None:
        return None  # not the dependents' fault (size, damage, cycle, a long chain)
    out: dict[bytes, _Job] = {}
    for dep in chunks.dependents(txn, cid):
        meta = chunks.meta(txn, dep)
        depth = _depth_through(store, txn, dep, root)
        if meta is None or meta.damaged or depth is None:
            return None
        if not isinstance(meta.where, (HotFrame, Inline)):
            return None  # packed: not ours to re-encode
        out[dep] = _Job(dep, meta, ((root, depth),))
    return out


def _bases(
    store: CompactParts,
    txn: lmdb.Transaction,
    cid: bytes,
    partner: bytes | None,
    height: int | None = None,
) -> tuple[tuple[bytes, int], ...]:
    if partner is None:
        return ()
    out = []
    root = store.chunks.chain(txn, partner, MAX_CHAIN)[-1]
    for base in dict.fromkeys((partner, root)):
        depth = _depth_through(store, txn, cid, base, height)
        if depth is not None:
            out.append((base, depth))
    return tuple(out)


def _base_orphaned(store: CompactParts, txn: lmdb.Transaction, cid: bytes) -> bool:
    base = store.chunks.base_of(txn, cid)
    meta = store.chunks.meta(txn, base) if base is not None else None
    return meta is None or meta.refs == 0


def _depth_through(
    store: CompactParts, txn: lmdb.Transaction, cid: bytes, base: bytes, height: int | None = None
) -> int | None:
    """How many deltas a read of `cid` would decode as a delta against `base`; None if it
    may not: the base is unsound or of another length, needs `cid` itself, or the longest
    chain through `cid` would pass MAX_CHAIN. `height`: the longest chain of dependents
    ending at `cid` (None: as stored now)."""
    chunks = store.chunks
    meta, base_meta = chunks.meta(txn, cid), chunks.meta(txn, base)
    if meta is None or base_meta is None or base_meta.damaged or base_meta.size != meta.size:
        return None
    chain = chunks.chain(txn, base, MAX_CHAIN)
    if cid in chain or len(chain) > MAX_CHAIN:
        return None
    if height is None:
        height = chunks.dependent_height(txn, cid, MAX_CHAIN)
    if height is None or height + len(chain) > MAX_CHAIN:
        return None
    return len(chain)


def _run_batch(
    store: CompactParts, reader: Reader, recoder: Recoder, batch: list[_Job], report: CompactReport
) -> None:
    frames_out = _encode(reader, recoder, batch, report)
    # Let go of the map's pages the batch read (its frames and their chains are copied out
    # by now), and after the switch those the writer touched dropping the old frames. The
    # reader trims by bytes read, the writer by bytes written; but each small delta frame
    # read, and each leaf a dropped frame leaves, maps the kernel's fault-around (64 KiB)
    # for a few KB counted or none: one compaction of a whole embedding series held 155 MiB
    # of the frames file mapped, the server's VmHWM 365 MiB (issue 32 asks under 300).
    store.frames_env.note_io(TRIM_EVERY_BYTES)
    if frames_out:
        _switch(store, frames_out, report)
        store.frames_env.note_io(TRIM_EVERY_BYTES)


def _encode(
    reader: Reader, recoder: Recoder, batch: list[_Job], report: CompactReport
) -> list[tuple[_Job, bytes]]:
    """Read the batch and its bases (verified) and encode each chunk's smallest frame."""
    if not batch:
        return []
    bases = sorted({b for j in batch for b, _ in j.bases})
    wanted = [j.cid for j in batch] + bases
    metas, frames = reader.frames(wanted)
    plain, damaged = reader.decoded(wanted, metas, frames)
    if damaged:
        reader.flag_damaged(damaged)
    text = {c: p for c, p in zip(wanted, plain, strict=True) if p is not None}
    report.bytes_read += sum(len(p) for p in text.values())
    frames_out: list[tuple[_Job, bytes]] = []
    for job in batch:
        data = text.get(job.cid)
        if data is None:
            report.skipped += 1
            continue
        frame = _smallest(recoder, job, data, text)
        if frame is not None:
            frames_out.append((job, frame))
    return frames_out


def _switch(
    store: CompactParts, frames_out: list[tuple[_Job, bytes]], report: CompactReport
) -> None:
    """Point each chunk at its new frame if it is still where it was read, then drop the
    frames left behind (after the switch is durable: never a pointer to nothing)."""
    chunks = store.chunks

    def switch(w: WriteTxn) -> list[tuple[ChunkMeta, int, bool]]:
        switched = []
        for job, frame in frames_out:
            meta = chunks.meta(w.catalog, job.cid)
            if meta is None or meta.where != job.meta.where or meta.damaged:
                continue  # collected, moved or healed since it was read
            base = delta_base(frame)
            if base is not None and _depth_through(store, w.catalog, job.cid, base) is None:
                continue
            chunks.recode(w, job.cid, meta, frame)
            switched.append((meta, len(frame), base is not None))
        return switched

    switched = store.writer.run(switch, size=sum(len(f) for _, f in frames_out))
    report.skipped += len(frames_out) - len(switched)
    left = [m.where for m, _, _ in switched]
    if left:
        store.writer.run(lambda w: chunks.drop_hot_frames(w.frames, left))
    for meta, stored, is_delta in switched:
        report.chunks_recoded += 1
        report.deltas += is_delta
        report.grouped += not is_delta
        report.bytes_before += meta.stored
        report.bytes_after += stored


def _smallest(
    recoder: Recoder, job: _Job, data: bytes | memoryview, text: Mapping[bytes, bytes | memoryview]
) -> bytes | None:
    """The cheapest frame for `data` (size, plus DEPTH_COST of it per delta a read then
    decodes), if it saves enough over what is stored now; a delta whose base is orphaned
    is always re-encoded (so the base can go)."""
    width = recoder.best_width(data)  # one width per chunk: its chain decodes in one pass
    options = [(float(len(frame := recoder.grouped(data, width))), frame)]
    for base_id, depth in job.bases:
        base = text.get(base_id)
        if base is not None:
            frame = recoder.delta(data, base_id, base, width)
            options.append((len(frame) * (1 + DEPTH_COST * depth), frame))
    best = min(options, key=lambda o: o[0])[1]
    if job.meta.delta:
        return best
    if len(best) <= job.meta.stored - job.meta.stored // MIN_SAVING_FRACTION:
        return best
    return None
