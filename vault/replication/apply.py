"""A standby's changes: the replica's log, or a whole rebuilt state, applied to a live vault
that serves reads meanwhile, so that no reader sees a state the primary never had.

Readers take one catalog read transaction for a reference, a manifest or a listing, and
then read frames in another (docs/DESIGN.md, "Read path"), so what they need is: the
catalog moves from one of the primary's states to a later one in one transaction, and every
frame a catalog state names is present while that state is visible. The primary keeps the
second by deleting a frame only in a later batch than the one that stopped naming it. A
standby applies many batches at once, so it applies them in runs, each as two writer
batches:

1. the run's frame puts (and anything else but frame deletes), then all its catalog
   records in order, in one transaction: readers see the state before the run or after it,
   and the frames either state names are there;
2. the run's frame deletes, once the catalog no longer names them.

Deferring deletes past puts is what a run must make harmless: a frame key deleted and then
put again (a primary restarted on a clean close numbers new frames after the last one left,
so it may reuse the number of a frame it deleted) must not be deleted after its new put, so
a run ends before a batch that puts a frame key the run deleted.

A rebuilt state (a new generation's base and log, built in a scratch directory) is converged
onto the live environments the same way: frames it has that the vault lacks (or holds with
other bytes), then every catalog database made equal to it in one transaction, then the
frames it lacks deleted.

Both go through the writer (`replicated=True`, past the standby's refusal), which syncs and
grows the maps as for any change. A crash between the two steps leaves frames nothing names;
the follower records that a change was under way and rebuilds (vault/replication/follow.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..env import CATALOG_DBS, FRAME_DBS, Env
from ..writer import WriteTxn
from .changes import CATALOG, DELETE, ENV_DBS, FRAMES, PUT, BatchLog, replay

if TYPE_CHECKING:
    from ..env import Env
    from ..writer import Writer


class ApplyParts(Protocol):
    """What applying a replicated log needs of the store."""

    @property
    def catalog_env(self) -> Env: ...
    @property
    def frames_env(self) -> Env: ...
    @property
    def writer(self) -> Writer: ...


def frame_runs(batches: list[BatchLog]) -> list[list[BatchLog]]:
    """`batches` in order, cut so that no run deletes a frame key and then puts it again."""
    runs: list[list[BatchLog]] = []
    run: list[BatchLog] = []
    deleted: set[bytes] = set()
    for batch in batches:
        puts = {r[3] for r in batch.records if r[0] == FRAMES and r[1] == PUT}
        if run and not puts.isdisjoint(deleted):
            runs.append(run)
            run, deleted = [], set()
        run.append(batch)
        deleted.update(r[3] for r in batch.records if r[0] == FRAMES and r[1] == DELETE)
    if run:
        runs.append(run)
    return runs


def apply_run(store: ApplyParts, run: list[BatchLog]) -> set[str]:
    """Apply one run (see the module docstring); returns the catalog databases it touched."""
    frames_db = [store.frames_env.db[n.decode()] for n in ENV_DBS[FRAMES]]
    catalog_db = [store.catalog_env.db[n.decode()] for n in ENV_DBS[CATALOG]]
    records = [r for batch in run for r in batch.records]
    first = [r for r in records if r[0] == FRAMES and r[1] != DELETE]
    catalog = [r for r in records if r[0] == CATALOG]
    last = [r for r in records if r[0] == FRAMES and r[1] == DELETE]

    def changes(w: WriteTxn) -> None:
        for _, kind, db, key, value in first:
            replay(w.frames, frames_db[db], kind, key, value)
        for _, kind, db, key, value in catalog:
            replay(w.catalog, catalog_db[db], kind, key, value)

    def deletes(w: WriteTxn) -> None:
        for _, _, db, key, _ in last:
            w.frames.delete(key, db=frames_db[db])

    store.writer.run(changes, sum(len(r[3]) + len(r[4]) for r in records), replicated=True)
    if last:
        store.writer.run(deletes, replicated=True)
    return {CATALOG_DBS[r[2]].decode() for r in catalog}


def converge(store: ApplyParts, catalog: Env, frames: Env) -> int:
    """Make the live vault equal to the state in `catalog` and `frames` (see the module
    docstring); returns how many keys changed."""
    counts = [0, 0]  # set by each step (the writer re-runs a step after growing the map)

    def additions(w: WriteTxn) -> None:
        n = 0
        with frames.read() as src:
            for name in FRAME_DBS:
                live = store.frames_env.db[name.decode()]
                for key, value in src.cursor(db=frames.db[name.decode()]):
                    if w.frames.get(key, db=live) != value:
                        w.frames.put(key, value, db=live)
                        n += 1
        with catalog.read() as src:
            for name in CATALOG_DBS:
                db = name.decode()
                n += _mirror(w.catalog, store.catalog_env.db[db], src, catalog.db[db])
        counts[0] = n

    def removals(w: WriteTxn) -> None:
        n = 0
        with frames.read() as src:
            for name in FRAME_DBS:
                live, theirs = store.frames_env.db[name.decode()], frames.db[name.decode()]
                keys = [bytes(k) for k in w.frames.cursor(db=live).iternext(values=False)]
                for key in keys:
                    if src.get(key, db=theirs) is None:
                        w.frames.delete(key, db=live)
                        n += 1
        counts[1] = n

    store.writer.run(additions, replicated=True)
    store.writer.run(removals, replicated=True)
    return sum(counts)


def _mirror(dst: Any, dst_db: Any, src: Any, src_db: Any) -> int:
    """Make database `dst_db` (in write transaction `dst`) hold exactly what `src_db` holds."""
    changed = 0
    for key, value in src.cursor(db=src_db):
        if dst.get(key, db=dst_db) != value:
            dst.put(key, value, db=dst_db)
            changed += 1
    stale = [
        bytes(k)
        for k in dst.cursor(db=dst_db).iternext(values=False)
        if src.get(k, db=src_db) is None
    ]
    for key in stale:
        dst.delete(key, db=dst_db)
    return changed + len(stale)
