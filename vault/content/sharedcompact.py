"""Compaction of the cluster's shared index (shared.py): segments merged into one segment
of all their packs, so a process that starts fetches a few dozen objects instead of one
per pack ever shipped, and the store holds fewer small objects.

kopia compacts its index blobs by epochs; here the levels are by size, since the GC's
condemned generations (sharedgc.py) already give every process the common view a merge
needs, and no epoch markers have to be agreed on. A segment listing p packs is of level
floor(log_fanin(p)); once `fanin` segments of one level are listed, they are merged into
one, written before they are deleted. So n packs stay listed by about fanin x
log_fanin(n) segments, and each pack is written again log_fanin(n) times in all. A
segment of `MAX_ROWS` chunks or more is never merged again (a cold start then fetches ~60
MB objects, not one).

Safety, in the GC's terms (sharedgc.py invariants 1-5, which this extends):
1. A merged segment makes its packs findable again, as a take does, so it follows the
   take's rule: it lists only packs not condemned in a view of the condemned generations
   applied right before (forced), and its put starts within `grace / 4` of that view.
   The store answers a put within `PUT_BOUND` (the client's timeout and retries), so it
   is listed before `grace / 2` has passed when `grace >= MIN_GRACE`; compaction does not
   run with a shorter grace. A sweep deletes a pack at least `grace` after condemning it,
   and lists the index right before: it sees the merged segment and writes it again
   without the doomed pack (`Sweeper._unlist`) before deleting the pack.
2. A segment that lists a condemned pack is never merged: the sweep decides that pack
   (deleted, and its segments with it, or released).
3. Sources are deleted only after the merged segment is written: a reader lists both
   (the same frames twice: shared.py invariant 4) or the merged one alone; a reader whose
   listing predates the merged segment and finds a source gone lists again before it
   calls a pack unlisted (`SharedIndex.lists`).
Crash points: killed before the put, nothing changed; after it, before or during the
deletes, the sources and the merged segment are both listed, and the next compaction
merges them again (each pack once).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ObjectNotFound
from .shared import Listing, SharedIndex
from .sharedgc import Condemned

log = logging.getLogger("ckpt.sharedgc")

FANIN = 16  # segments of one level merged at once
MAX_ROWS = 1 << 20  # chunks in a segment past which it is not merged again (~61 MB)
PUT_BOUND = 90.0  # seconds: the store client's timeout (60 s) and its retries, rounded up
MIN_GRACE = 4 * PUT_BOUND  # below it a merge could land after a sweep listed the index


@dataclass
class CompactReport:
    merged: int = 0  # segments merged (and deleted)
    written: int = 0  # merged segments written
    skipped: str | None = None  # why nothing was merged, when something might have been


def level(packs: int, fanin: int) -> int:
    return int(math.log(max(packs, 1), fanin)) if fanin > 1 else 0


def compact(
    gate: Condemned, grace: float, fanin: int = FANIN, max_rows: int = MAX_ROWS
) -> CompactReport:
    """Merge each level that has `fanin` mergeable segments (invariants above)."""
    report = CompactReport()
    if grace < MIN_GRACE:
        report.skipped = f"the GC grace ({grace:g} s) is under {MIN_GRACE:g} s"
        return report
    if fanin < 2:
        return report
    index = gate.index
    gate.refresh()  # a view applied now, and the index listed under it
    viewed = gate.now()
    index.refresh()
    by_level: dict[int, list[str]] = {}
    for seg, (packs, rows) in index.sizes().items():
        if rows < max_rows:
            by_level.setdefault(level(packs, fanin), []).append(seg)
    segments = index.segments()
    for lvl in sorted(by_level):
        mergeable = [s for s in by_level[lvl] if all(gate.allows(p) for p in segments[s])]
        if len(mergeable) < fanin:
            continue
        listing = _merged(index, mergeable)
        if listing is None:
            report.skipped = "a segment went while it was merged (another compaction)"
            continue
        if not _in_time(gate.now, viewed, grace) or not all(gate.allows(p) for p, _ in listing):
            report.skipped = "the condemned view aged or changed before the write"
            break
        index.publish_merged(listing)
        report.written += 1
        for seg in mergeable:
            index.tier.delete(seg)
            report.merged += 1
    if report.merged:
        index.refresh()
        log.info("shared index: %d segments merged into %d", report.merged, report.written)
    return report


def _merged(index: SharedIndex, segments: list[str]) -> Listing | None:
    """Every pack the segments list, once (a pack listed twice holds the same frames)."""
    out: Listing = []
    seen: set[str] = set()
    for seg in segments:
        try:
            listing = index.fetch(seg)
        except ObjectNotFound:
            return None
        for pack, rows in listing:
            if pack not in seen:
                seen.add(pack)
                out.append((pack, rows))
    return out


def _in_time(clock: Callable[[], float], viewed: float, grace: float) -> bool:
    return clock() - viewed < grace / 4
