"""GC of the cluster's shared tier across nodes: a pack goes only when no shard's catalog
names it and none can start to (kopia's two-phase GC, in this cluster's terms).

Objects, beside the packs and the index (shared.py):
- `gc/marks/<shard>/<epoch>.mark`: JSON, every shared pack the shard's catalog names (its
  packed chunks there, adopted chunks reserved by saves in flight included), written by
  the shard's primary at each GC. Keyed by shard and replica epoch, never by process: a
  shard's highest epoch is its owner's, so a fenced old primary's mark is ignored. A
  process claims its epoch (a mark with `ack` -1, conditional create) before its first
  take, so a new owner blocks deletes until it has marked.
- `gc/condemned/<gen>.cnd`: JSON, generation `gen` of the condemned packs, created with a
  conditional create (one sweeper wins a generation). The newest generation is the set.

Protocol. A process *applies* a generation (lists `gc/condemned/`, reads the newest,
re-lists the index so deleted segments go, excludes the condemned packs from lookups) at
least every `grace / 4` of its own clock before it takes a chunk from the index, and
takes nothing from a condemned pack (shared.py, invariant 6). A mark records the newest
generation its process had applied (`ack`) before a no-op writer transaction and the
catalog read: every take checked against an older view has committed before the read and
is in the mark; every later take saw the generation. A sweep (any process, at any time):
1. needs the newest mark of every shard (the shard count is the cluster's): a shard with
   no mark, or only a claim, blocks it;
2. phase 2 of the newest generation G: if every shard's mark acks G and was written at
   least `grace` (+1 s, the store's timestamps being whole seconds) after G, by the
   store's clock (Last-Modified; no node's clock is compared), G's packs named by no mark
   are deleted (segments first, then index and pack) and the named ones are un-condemned;
   otherwise it stops here;
3. phase 1: packs listed, named by no mark, and listed before the oldest of the marks
   were written (each mark had the chance to name them), become generation G+1, with
   nothing of G (deleted or un-condemned).

Invariants (why nothing in use is deleted):
1. A catalog names a shared pack only after a take, and a take happens only while the
   pack is not condemned in a view applied within the last `grace / 2` (by the taking
   process's clock), checked in the writer transaction that records it.
2. Once a process applied G, its later marks name every G pack its catalog names, and it
   takes from no G pack until a later generation releases it: a G pack absent from its
   mark acking G stays absent (so concurrent sweepers decide the same packs).
3. A pack is deleted only if, for every shard, the owner's mark (the highest epoch's) acks
   G and omits it. Another process of a shard (a restart, a new owner) applies the newest
   generation before its first take: a restart at the same epoch finds G; a new owner
   claims a newer epoch first, so the sweep either sees the claim (blocked) or the new
   owner's takes come after the sweep read the marks, which is at least `grace` after G
   was written; its view was then at most `grace / 2` old, so it held G.
4. A mark is written after the writer's commits are durable and the replica has them, so
   a standby promoted later names no pack the mark omits.
5. Generation G+1 is written only after every pack G dooms is gone: a process that
   applies G+1 re-lists the index first, so a deleted pack is never looked up again.

Crash points. A process killed before its mark: the shard's previous mark stands (a mark
is one put). A sweeper killed during phase 2: some of G's doomed segments or packs gone,
G still the newest; the next sweep repeats the deletes (idempotent) and no process takes
from G's packs meanwhile. Killed before G+1: the same. Two sweepers: the same doomed set
(invariant 2), one of them creates G+1. A process killed between applying G and its
mark: its previous mark stands, blocking G's deletes until the next one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import ObjectExists, ObjectNotFound, TierError
from ..tier import modified
from .packs import PACK_PREFIX, delete_pack
from .shared import SharedIndex

if TYPE_CHECKING:
    from .parts import ContentParts

log = logging.getLogger("ckpt.sharedgc")

MARKS = "gc/marks/"
CONDEMNED = "gc/condemned/"
RESOLUTION = 1.0  # seconds: S3's Last-Modified is whole seconds
REPLICA_WAIT = 30.0  # seconds a mark waits for the replica to have what it read
CLAIM = -1  # the `ack` of a claim: a mark that names nothing yet and acks nothing


@dataclass(frozen=True)
class Mark:
    shard: int
    epoch: int
    writer: str  # the process, for operators (never part of the key)
    ack: int  # the newest condemned generation applied before the catalog read
    packs: frozenset[str]

    @property
    def key(self) -> str:
        return mark_key(self.shard, self.epoch)

    def encode(self) -> bytes:
        return json.dumps(
            {
                "shard": self.shard,
                "epoch": self.epoch,
                "writer": self.writer,
                "ack": self.ack,
                "packs": sorted(self.packs),
            }
        ).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Mark:
        d = json.loads(raw)
        return cls(
            int(d["shard"]), int(d["epoch"]), str(d["writer"]), int(d["ack"]),
            frozenset(str(p) for p in d["packs"]),
        )  # fmt: skip


def mark_key(shard: int, epoch: int) -> str:
    return f"{MARKS}{shard:04d}/{epoch:06d}.mark"


@dataclass(frozen=True)
class Generation:
    number: int  # 0: none written yet (nothing condemned)
    packs: frozenset[str]
    by: str = ""
    written: float | None = None  # store time (Last-Modified)

    @property
    def key(self) -> str:
        return generation_key(self.number)

    def encode(self) -> bytes:
        return json.dumps({"gen": self.number, "by": self.by, "packs": sorted(self.packs)}).encode()


def generation_key(number: int) -> str:
    return f"{CONDEMNED}{number:012d}.cnd"


def _numbers(keys: list[str], prefix: str, suffix: str) -> list[int]:
    out = []
    for k in keys:
        mid = k[len(prefix) : -len(suffix)] if k.endswith(suffix) else ""
        if mid.isdigit():
            out.append(int(mid))
    return out


def newest_generation(index: SharedIndex, known: int = -1) -> Generation | None:
    """The newest condemned generation in the store; None if it is `known` already."""
    tier = index.tier
    numbers = _numbers(list(tier.list(CONDEMNED)), CONDEMNED, ".cnd")
    newest = max(numbers, default=0)
    if newest == known:
        return None
    if newest == 0:
        return Generation(0, frozenset())
    key = generation_key(newest)
    written = modified(tier, key)
    d = json.loads(tier.get(key))
    return Generation(newest, frozenset(str(p) for p in d["packs"]), str(d["by"]), written)


class Condemned:
    """This process's view of the condemned packs: the `Gate` of its shared index."""

    def __init__(
        self,
        index: SharedIndex,
        shard: int,
        epoch: Callable[[], int | None],
        grace: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`epoch`: the replica epoch this process writes its shard under, None while it
        takes no writes (a standby, a fenced primary): then it takes nothing."""
        self.index = index
        self.shard = shard
        self.epoch = epoch
        self.refresh_every = grace / 4
        self._clock = clock
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()
        self.applied = -1  # the generation applied; -1: none yet
        self._packs: frozenset[str] = frozenset()
        self._at = float("-inf")  # when the applied view was last confirmed newest
        self._claimed: int | None = None
        self.seg_times: dict[str, float] = {}  # for this process's sweeps (`Sweeper`)

    def refresh(self) -> int:
        """Apply the newest generation and claim this process's epoch; the generation.
        Raises `TierError` when the store does not answer (the view then goes stale)."""
        with self._refreshing:
            started = self._clock()
            gen = newest_generation(self.index, self.applied)
            if gen is not None:
                self.index.refresh()  # segments the sweep deleted go first (invariant 5)
                self.index.exclude(gen.packs)
            epoch = self.epoch()
            if epoch is not None and epoch != self._claimed:
                claim = Mark(self.shard, epoch, self.index.writer, CLAIM, frozenset())
                # ObjectExists: this epoch has marked (this process before a restart)
                with contextlib.suppress(ObjectExists):
                    self.index.tier.put(claim.key, claim.encode(), if_absent=True)
            with self._lock:
                if gen is not None:
                    self.applied, self._packs = gen.number, gen.packs
                self._claimed = epoch if epoch is not None else self._claimed
                self._at = started
                return self.applied

    def now(self) -> float:
        """This process's clock, the one its views are dated by."""
        return self._clock()

    def ready(self) -> bool:
        epoch = self.epoch()
        if epoch is None:
            return False
        with self._lock:
            fresh = self._clock() - self._at < self.refresh_every and self._claimed == epoch
        if fresh:
            return True
        try:
            self.refresh()
        except (TierError, ValueError, KeyError) as e:  # the store down, or an object damaged
            log.warning("shared tier: condemned packs not refreshed, taking nothing: %s", e)
            return False
        return True

    def allows(self, pack_key: str) -> bool:
        epoch = self.epoch()
        with self._lock:
            return (
                epoch is not None
                and self._claimed == epoch
                and self._clock() - self._at < 2 * self.refresh_every
                and pack_key not in self._packs
            )


def publish_mark(parts: ContentParts, gate: Condemned, epoch: int) -> Mark | None:
    """Name every shared pack this shard's catalog names, acking the generation applied
    first; None if the replica did not catch up in time (no mark: deletes wait)."""
    index = gate.index
    ack = gate.refresh()
    parts.writer.wait_durable()  # a no-op commit: takes checked against older views are in
    barrier = parts.replica_barrier
    if barrier is not None and not barrier(REPLICA_WAIT):
        return None
    with parts.catalog_env.read() as txn:
        packs = {w.key for _, w in parts.chunks.packed_locations(txn) if w.tier == index.tier_name}
    mark = Mark(gate.shard, epoch, index.writer, ack, frozenset(packs))
    index.tier.put(mark.key, mark.encode())
    return mark


@dataclass
class SweepReport:
    condemned: int = 0  # packs this sweep condemned (a new generation)
    deleted: int = 0  # packs deleted (phase 2)
    bytes_freed: int = 0
    released: int = 0  # condemned packs a mark named again
    waiting: str | None = None  # why phase 2 did not run (nothing is wrong)
    generation: int = 0  # the newest generation after the sweep
    notes: list[str] = field(default_factory=list)


def newest_marks(index: SharedIndex, shards: int) -> dict[int, tuple[Mark, float]]:
    """Each shard's mark at its highest epoch, with its store time (read before its
    content, so a mark overwritten in between is dated older than it is: conservative)."""
    tier = index.tier
    best: dict[int, tuple[int, str]] = {}
    for key in tier.list(MARKS):
        parts = key[len(MARKS) :].split("/")
        if len(parts) != 2 or not parts[0].isdigit() or not parts[1].endswith(".mark"):
            continue
        shard, epoch = int(parts[0]), parts[1][: -len(".mark")]
        if shard < shards and epoch.isdigit() and int(epoch) >= best.get(shard, (-1, ""))[0]:
            best[shard] = (int(epoch), key)
    out = {}
    for shard, (_, key) in best.items():
        written = modified(tier, key)
        try:
            mark = Mark.decode(tier.get(key))
        except ObjectNotFound:
            continue
        if written is not None:
            out[shard] = (mark, written)
    return out


class Sweeper:
    """Phase 2 of the newest generation, then phase 1 of the next (module docstring).
    Any process may run one at any time, beside any other."""

    def __init__(
        self,
        index: SharedIndex,
        shards: int,
        grace: float,
        seg_times: dict[str, float] | None = None,
    ) -> None:
        """`seg_times`: segments' store times seen by earlier sweeps (they are immutable,
        so a process dates each once: pass the same dict to every sweep)."""
        self.index = index
        self.shards = shards
        self.grace = grace
        self._seg_times = seg_times if seg_times is not None else {}

    def sweep(self) -> SweepReport:
        report = SweepReport()
        tier = self.index.tier
        gen = newest_generation(self.index)
        assert gen is not None
        report.generation = gen.number
        marks = newest_marks(self.index, self.shards)
        lacking = [k for k in range(self.shards) if k not in marks or marks[k][0].ack == CLAIM]
        if lacking:
            report.waiting = f"no mark from shard {lacking[0]} yet"
            return report
        named = frozenset().union(*(m.packs for m, _ in marks.values()))
        doomed: set[str] = set()
        if gen.packs:
            due = (gen.written or float("inf")) + self.grace + RESOLUTION
            late = [k for k, (m, t) in marks.items() if m.ack < gen.number or t < due]
            if late:
                report.waiting = (
                    f"shard {late[0]} has not marked since generation {gen.number} "
                    f"plus the grace ({self.grace:g} s)"
                )
                return report
            doomed = set(gen.packs - named)
            report.released = len(gen.packs & named)
        self.index.refresh()
        segments = self.index.segments()
        self._unlist(doomed, segments)  # first: nobody finds them again
        for pack in sorted(doomed):
            size = tier.head(pack) or 0
            delete_pack(tier, pack[len(PACK_PREFIX) :])
            report.deleted += 1
            report.bytes_freed += size
        if doomed:
            self.index.refresh()
            segments = self.index.segments()
        oldest = min(t for _, t in marks.values())
        candidates: set[str] = set()
        for seg, packs in segments.items():
            left = packs - named - gen.packs
            if not left:
                continue
            written = self._written(seg)
            if written is not None and written + RESOLUTION <= oldest:
                candidates |= left
        if candidates or gen.packs:
            nxt = Generation(gen.number + 1, frozenset(candidates), self.index.writer)
            try:
                tier.put(nxt.key, nxt.encode(), if_absent=True)
                report.condemned = len(candidates)
                report.generation = nxt.number
            except ObjectExists:
                report.notes.append(f"generation {nxt.number} was written by another sweeper")
        self._tidy(gen.number, marks)
        return report

    def _unlist(self, doomed: set[str], segments: dict[str, frozenset[str]]) -> None:
        """Every segment naming a doomed pack deleted; one that names other packs too (a
        compaction's) is first written again without the doomed ones. A compaction that
        merged a doomed pack after this listing is impossible: it merges only packs not
        condemned in a view at most `grace / 2` old (sharedcompact.py), and phase 2 runs
        at least `grace` after the condemnation."""
        for seg, packs in segments.items():
            if not packs & doomed:
                continue
            if packs - doomed:
                try:
                    listing = self.index.fetch(seg)
                except ObjectNotFound:
                    continue  # another sweeper or a compaction replaced it: listed anew
                self.index.publish_merged([(k, rows) for k, rows in listing if k not in doomed])
            self.index.tier.delete(seg)

    def _written(self, seg: str) -> float | None:
        if seg not in self._seg_times:
            written = modified(self.index.tier, seg)
            if written is None:
                return None
            self._seg_times[seg] = written
        return self._seg_times[seg]

    def _tidy(self, newest: int, marks: dict[int, tuple[Mark, float]]) -> None:
        """Older generations, and marks of epochs below their shard's owner's, are read by
        nobody: delete them."""
        tier = self.index.tier
        for number in _numbers(list(tier.list(CONDEMNED)), CONDEMNED, ".cnd"):
            if number < newest:
                tier.delete(generation_key(number))
        for shard, (mark, _) in marks.items():
            prefix = f"{MARKS}{shard:04d}/"
            for number in _numbers(list(tier.list(prefix)), prefix, ".mark"):
                if number < mark.epoch:
                    tier.delete(mark_key(shard, number))
