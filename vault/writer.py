"""The single writer thread: every LMDB write goes through it, with group commit.

Callers submit operations (functions of a `WriteTxn`) and get a Future. The thread drains
whatever is queued, up to a byte budget, runs each operation in its own nested transactions
(so one failing operation cannot spoil the others; a batch of one, every lone small save,
runs in the two transactions themselves, which a failure aborts), then commits the frame
environment, then the catalog, and goes on to the next batch. The commits do not sync: the syncer
(vault/syncer.py) makes the state each batch left durable, on its own thread, and only then
are the batch's Futures resolved. A hundred small chunk writes share one cycle of syncs,
the disk writes one batch while the next is applied, and the event loop never touches it.

Crash safety: a batch is durable whole, both environments at once, or not at all (the
syncer's recovery returns both to the same batch boundary), so a catalog record never
points at frames the disk lost.

A `CommitObserver` (replication, vault/replication/) sees every committed change: operations
run on its recording views of their transactions, and once a batch is durable it receives
the records of the operations that committed. If it answers with a Future, the callers' futures
resolve only when that one does (synchronous replication), and fail with its error if it
fails (the primary was fenced: the commit is local only and will never be in the replica);
the writer moves on meanwhile. An operation submitted `local` is acknowledged once its batch
is durable here, without waiting for that Future (a part's writes, vault/parts.py: its
bytes reach the bucket by shipping, which the owner's record tracks); the observer still
sees it, in commit order, so an acknowledgement that did wait implies every batch before
it is replicated too.

A writer can refuse changes (`refuse`): a standby's, whose only changes are the replica's
log applied by its follower (`submit(..., replicated=True)`), and a fenced primary's. The
refusal is checked where every change enters, so no route, job or read path can slip one
past it.

A batch of one-request saves may be acknowledged by their records in the save journal
instead (vault/journal.py, `_journal`): one sequential append and sync, the catalog's
state synced behind it as for every batch.

`stage` is for writes whose durability is only needed later, at a commit that names them
(the chunk batches of an open upload): its caller gets the operation's value as soon as the
batch has run, while the batch syncs, so a client's next batch travels during the fsync.
The Future it hands back resolves at durability; whoever acknowledges a checkpoint built on
those writes waits for it first (vault/uploads.py `settle`). A crash in between loses
only writes nothing durable names yet: a commit then finds the chunks missing.
"""

from __future__ import annotations

import errno
import logging
import math
import queue
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import lmdb

from .env import Env
from .journal import Journal
from .runtime import Spawn
from .syncer import Syncer

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_BATCH_BYTES = 32 << 20  # ~0.1 s of LMDB writes here; bounds commit latency
MAX_BATCH_OPS = 4096
# Append errors that pass by themselves: the journal is kept on through them.
TRANSIENT = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})


@dataclass(frozen=True)
class WriteTxn:
    """The two write transactions an operation runs in."""

    catalog: lmdb.Transaction  # in the catalog environment
    frames: lmdb.Transaction  # in the frame environment


Op = Callable[[WriteTxn], Any]
# An operation's record for the save journal (vault/journal.py), made from its value once
# it ran: what applies the same change again. None: it changed nothing.
Journaled = Callable[[Any], bytes | None]


class CommitObserver(Protocol):
    def record(self, w: WriteTxn) -> tuple[WriteTxn, Any]:
        """A view of `w` that records its changes, and the handle they collect in."""
        ...

    def committed(self, records: list[Any]) -> Future[None] | None:
        """Once a batch is durable (syncer thread, batches in commit order): the handles of
        the operations that committed, in order. A Future returned holds back the callers'
        acknowledgements until done."""
        ...


@dataclass
class _Item:
    op: Op
    size: int
    future: Future[Any] = field(default_factory=Future)
    applied: Future[Any] | None = None  # staged operations: resolved before the syncs
    journal: Journaled | None = None  # the op's record for the save journal, from its value
    # Run alone between batches, with everything durable and no pin held (`quiesced`)
    alone: Callable[[], Any] | None = None
    local: bool = False  # acknowledged once durable here, not waiting for the observer


@dataclass
class WriterStats:
    """Since the vault opened; read by metrics (group-commit size = ops / batches)."""

    batches: int = 0
    ops: int = 0
    bytes: int = 0
    map_growths: int = 0
    chunks_written: int = 0  # frames stored by uploads and saves
    chunks_deduplicated: int = 0  # chunks offered that the vault already had
    journaled_batches: int = 0  # acknowledged by their save-journal records
    journal_records: int = 0
    journal_bytes: int = 0


class Writer:
    def __init__(
        self, catalog: Env, frames: Env, syncer: Syncer, spawn: Spawn, *, journaling: bool = True
    ) -> None:
        self._catalog = catalog
        self._frames = frames
        self._syncer = syncer
        # SimpleQueue: put and get in C, where queue.Queue takes a Python lock and makes a
        # Condition's waiter lock for every get that waits (one per small save).
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._closed = False
        self._observer: CommitObserver | None = None
        self._refusal: Callable[[], Exception] | None = None
        self._batch = 0  # batches committed so far; the last one's number
        self._last_plain = 0  # the newest batch not acknowledged by the journal
        self.journaling = journaling  # off by configuration, or once an append failed
        self._transient = 0  # appends that failed for want of descriptors or memory
        self._transient_at = -math.inf  # time.monotonic() of the last warning about them
        self.stats = WriterStats()
        self._thread = spawn("vault-writer", self._run)

    def submit(
        self,
        op: Callable[[WriteTxn], T],
        size: int = 0,
        *,
        replicated: bool = False,
        journal: Journaled | None = None,
        local: bool = False,
    ) -> Future[T]:
        """Queue `op`; the Future resolves once its effects are durable. Raises the refusal's
        error while changes are refused, unless `replicated` (the replica's log, applied by
        a standby). With `journal`, durable may mean its record in the save journal (see
        `_journal`); `local`: durable here, whatever the observer (the module docstring)."""
        return self._enqueue(_Item(op, size, journal=journal, local=local), replicated).future

    def _enqueue(self, item: _Item, replicated: bool = False) -> _Item:
        if self._closed:
            raise RuntimeError("writer is closed")
        refusal = self._refusal
        if refusal is not None and not replicated:
            raise refusal()
        self._queue.put(item)
        return item

    def observe(self, observer: CommitObserver) -> None:
        """Hand every committed change to `observer` from now on (set before any submit)."""
        self._observer = observer

    def refuse(self, error: Callable[[], Exception] | None) -> None:
        """From now on, `submit` raises `error()` (None: accept changes again). Operations
        queued before keep their place: they were accepted."""
        self._refusal = error

    def refusal(self) -> Callable[[], Exception] | None:
        """What refuses changes now (None: they are accepted)."""
        return self._refusal

    def run(
        self,
        op: Callable[[WriteTxn], T],
        size: int = 0,
        *,
        replicated: bool = False,
        local: bool = False,
    ) -> T:
        return self.submit(op, size, replicated=replicated, local=local).result()

    def wait_durable(self) -> None:
        """Return once every batch committed before the call is durable. Readers see a
        commit up to a sync cycle before it is (vault/syncer.py): call this before acting
        outside the vault on what a read saw, such as deleting an object in a tier."""
        self.run(lambda w: None)

    def quiesced(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the writer thread between two batches, with no transaction open,
        everything committed durable and none of the syncer's pins held, as map growth
        runs (vault/shrink.py gives free pages back to the file system there). Writes wait
        meanwhile; reads go on."""
        item = _Item(_no_op, 0, alone=fn)
        return self._enqueue(item).future.result()  # type: ignore[no-any-return]

    def stage(
        self, op: Callable[[WriteTxn], T], size: int = 0, *, local: bool = False
    ) -> tuple[T, Future[Any]]:
        """Run `op` and return its value once its batch has run (not yet synced), with the
        Future of its durability. An error of `op` itself is raised here, as `run` would."""
        applied: Future[T] = Future()
        item = self._enqueue(_Item(op, size, applied=applied, local=local))
        return applied.result(), item.future

    @property
    def journal(self) -> Journal:
        return self._syncer.journal

    def journal_on(self) -> bool:
        """May a batch be acknowledged by the journal now? (Off by configuration, after a
        failed append, or while an observer needs the catalog's durable state.)"""
        return self.journaling and self._observer is None

    def queue_depth(self) -> int:
        return self._queue.qsize()

    def close(self) -> None:
        """Finish everything queued and make it durable, then stop the threads."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join()
            self._syncer.close()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            if first.alone is not None:
                self._run_alone(first)
                continue
            batch = [first]
            size = first.size
            stop = False
            alone = None
            while size < MAX_BATCH_BYTES and len(batch) < MAX_BATCH_OPS:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None or nxt.alone is not None:
                    stop, alone = nxt is None, nxt
                    break
                batch.append(nxt)
                size += nxt.size
            self._commit_batch(batch, size)
            if alone is not None:
                self._run_alone(alone)
            if stop:
                return

    def _run_alone(self, item: _Item) -> None:
        """`quiesced`'s function, after every batch before it is durable."""
        assert item.alone is not None
        failure = self._syncer.failure
        if failure is not None:
            _settle(item.future, False, failure)
            return
        try:
            with self._syncer.quiesce():
                value = item.alone()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's future
            _settle(item.future, False, e)
        else:
            _settle(item.future, True, value)

    def _commit_batch(self, batch: list[_Item], size: int) -> None:
        while True:
            failure = self._syncer.failure
            if failure is not None:  # a sync failed: commit nothing more over the durable state
                _fail(batch, failure)
                return
            try:
                outcomes, records = self._apply(batch)
                break
            except lmdb.MapFullError:
                with self._syncer.quiesce():  # LMDB resizes with no transaction open
                    self._catalog.grow()
                    self._frames.grow()
                self.stats.map_growths += 1
            except BaseException as e:  # noqa: BLE001 - a failed commit fails every op in it
                log.exception("write batch failed")
                _fail(batch, e)
                return
        self.stats.batches += 1
        self.stats.ops += len(batch)
        self.stats.bytes += size
        self._frames.note_io(size)
        self._catalog.note_io(size)
        self._batch += 1
        journaled = self._journal(batch, outcomes)
        if not journaled:
            self._last_plain = self._batch
        # Only the futures wait for the syncer: the operations (and the chunk bytes their
        # closures hold) are let go now, not a cycle later.
        futures = [item.future for item in batch]
        local = [item.local for item in batch]
        if journaled:
            # Pinned for the syncer before the answers go: a resolved future wakes the
            # event loop, which then waits for the GIL on this thread's bookkeeping.
            try:
                self._syncer.after(_nobody, self._batch, waited=False)
            except Exception:  # noqa: BLE001 - the journal holds it: a later cycle syncs it
                log.exception("handing a journaled batch to the syncer failed")
            _resolve(futures, outcomes)
            return
        try:
            self._syncer.after(
                lambda failure: self._durable(futures, outcomes, records, failure, local),
                self._batch,
            )
        except Exception as e:  # noqa: BLE001 - e.g. no reader slot left for the pins
            # Committed but not tracked: a later batch's cycle makes it durable. Its callers
            # hear the error (a retry with an idempotency key finds the first attempt).
            log.exception("handing a batch to the syncer failed")
            _resolve(futures, outcomes, e)

    def _journal(self, batch: list[_Item], outcomes: list[tuple[bool, Any]]) -> bool:
        """Make the batch durable by its records in the save journal, if it may be: every
        operation in it has one, every batch before that was not journaled is durable
        (so a record is applied again on exactly the state it was first applied on: see
        vault/journal.py), and no observer (replication) waits for the catalog's state."""
        if (
            not self.journal_on()
            or any(item.journal is None for item in batch)
            or self._syncer.durable_batch < self._last_plain
        ):
            return False
        records = [
            record
            for item, (ok, value) in zip(batch, outcomes, strict=True)
            if ok and item.journal is not None and (record := item.journal(value)) is not None
        ]
        if records:
            journal = self._syncer.journal
            try:
                journal.applied = journal.append(records)
            except OSError as e:
                self._journal_failed(e)
                return False
            self.stats.journal_records += len(records)
            self.stats.journal_bytes += sum(len(r) for r in records)
        self.stats.journaled_batches += 1
        return True

    def _journal_failed(self, error: OSError) -> None:
        """A failed append: the batch waits for the catalog's sync instead. Running out of
        descriptors (EMFILE, ENFILE) or memory passes, so the journal stays on and is tried
        again at the next batch (a flood of connections switched it off until restart);
        any other error (a bad disk) switches it off. Warned a line a second at most."""
        if error.errno not in TRANSIENT:
            log.error(
                "the save journal failed: saves wait for the catalog's sync now", exc_info=error
            )
            self.journaling = False
            return
        self._transient += 1
        now = time.monotonic()
        if now - self._transient_at >= 1.0:
            self._transient_at = now
            log.warning(
                "the save journal could not append (%s; %d times so far): this batch waits "
                "for the catalog's sync, the journal stays on",
                error,
                self._transient,
            )

    def _durable(
        self,
        futures: list[Future[Any]],
        outcomes: list[tuple[bool, Any]],
        records: list[Any],
        failure: BaseException | None,
        local: list[bool],
    ) -> None:
        """The syncer thread, once the batch is on disk (or `failure` says it cannot be):
        hand it to the observer, in commit order, then answer its callers: the `local` ones
        now, the others when the observer's Future is done. One already failed (fenced)
        fails them all: a fenced primary's part could never be claimed or shipped."""
        if failure is not None:
            _resolve(futures, outcomes, failure)
            return
        ack = None
        if self._observer is not None:
            try:
                ack = self._observer.committed(records)
            except Exception:  # noqa: BLE001 - replication trouble never fails a local commit
                log.exception("commit observer failed")
        if ack is None:
            _resolve(futures, outcomes)
            return
        if any(local) and not (ack.done() and ack.exception() is not None):
            now = [i for i, mine in enumerate(local) if mine]
            _resolve([futures[i] for i in now], [outcomes[i] for i in now])
        ack.add_done_callback(lambda done: _resolve(futures, outcomes, done.exception()))

    def _apply(self, batch: list[_Item]) -> tuple[list[tuple[bool, Any]], list[Any]]:
        if len(batch) == 1:
            return self._apply_one(batch[0])
        catalog_env, frames_env = self._catalog.lmdb, self._frames.lmdb
        outcomes: list[tuple[bool, Any]] = []
        records: list[Any] = []
        frames = frames_env.begin(write=True)
        try:
            with catalog_env.begin(write=True) as catalog:
                for item in batch:
                    child = WriteTxn(
                        catalog_env.begin(write=True, parent=catalog),
                        frames_env.begin(write=True, parent=frames),
                    )
                    view, rec = (child, None)
                    if self._observer is not None:
                        view, rec = self._observer.record(child)
                    try:
                        value = item.op(view)
                    except lmdb.MapFullError:
                        child.frames.abort()
                        child.catalog.abort()
                        raise
                    except Exception as e:  # noqa: BLE001 - handed to the caller's future
                        child.frames.abort()
                        child.catalog.abort()
                        outcomes.append((False, e))
                    else:
                        child.frames.commit()
                        child.catalog.commit()
                        outcomes.append((True, value))
                        if rec is not None:
                            records.append(rec)
                _applied(batch, outcomes)
                frames.commit()  # frames durable first; the catalog commits on leaving `with`
        except BaseException:
            frames.abort()  # no-op if it already committed
            raise
        return outcomes, records

    def _apply_one(self, item: _Item) -> tuple[list[tuple[bool, Any]], list[Any]]:
        """A batch of one, in the two transactions themselves: a failing operation aborts
        both, which is all a child transaction would have undone (the commit of a batch of
        one spoils no other operation), so one save pays for no nested transactions."""
        frames = self._frames.lmdb.begin(write=True)
        try:
            catalog = self._catalog.lmdb.begin(write=True)
        except BaseException:
            frames.abort()
            raise
        txn = WriteTxn(catalog, frames)
        view, rec = (txn, None)
        try:
            if self._observer is not None:
                view, rec = self._observer.record(txn)
            value = item.op(view)
        except lmdb.MapFullError:
            frames.abort()
            catalog.abort()
            raise
        except BaseException as e:
            frames.abort()
            catalog.abort()
            if not isinstance(e, Exception):
                raise
            outcomes: list[tuple[bool, Any]] = [(False, e)]  # nothing of it was written
            _applied([item], outcomes)
            return outcomes, []
        outcomes = [(True, value)]
        _applied([item], outcomes)
        try:
            frames.commit()  # frames durable first, as for every batch
        except BaseException:
            catalog.abort()
            raise
        catalog.commit()
        return outcomes, [rec] if rec is not None else []


def _no_op(w: WriteTxn) -> None:
    """The operation of an item run alone (`Writer.quiesced`): it writes nothing."""


def _nobody(failure: BaseException | None) -> None:
    """The durability callback of a journal-acknowledged batch: its callers have their
    answers (a failed sync stops later batches and is recovered from at restart)."""


def _resolve(
    futures: list[Future[Any]],
    outcomes: list[tuple[bool, Any]],
    failure: BaseException | None = None,
) -> None:
    """Hand each caller its outcome; `failure` (the observer's, the syncer's) replaces
    every success."""
    for future, (ok, value) in zip(futures, outcomes, strict=True):
        if ok and failure is not None:
            _settle(future, False, failure)
        else:
            _settle(future, ok, value)


def _fail(batch: list[_Item], error: BaseException) -> None:
    """Every operation of a batch that did not commit fails with `error`."""
    for item in batch:
        _settle(item.future, False, error)
        if item.applied is not None:
            _settle(item.applied, False, error)


def _applied(batch: list[_Item], outcomes: list[tuple[bool, Any]]) -> None:
    """Tell staged callers their operation's outcome before the batch syncs."""
    for item, (ok, value) in zip(batch, outcomes, strict=True):
        if item.applied is not None:
            _settle(item.applied, ok, value)


def _settle(future: Future[Any], ok: bool, value: Any) -> None:
    if future.done():  # a batch re-run after map growth, or staged and told already
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class NoWriter(Writer):
    """The writer of a vault opened to read beside the process that writes (a worker of
    `ckpt serve --workers`): no thread, no syncer, and every change refused with `error`.
    The process that owns the data dir makes the changes; its workers forward every
    request that changes anything to it (node/forward.py), so this refusal is only met by
    a read path that would also write (marking a chunk damaged), which then fails cleanly
    instead of writing from a second process."""

    def __init__(self, error: Callable[[], Exception]) -> None:  # noqa: D107 - no super(): no thread
        self._closed = False
        self._refusal = error
        self._observer = None
        self._queue = queue.SimpleQueue()
        self.journaling = False
        self.stats = WriterStats()

    def refuse(self, error: Callable[[], Exception] | None) -> None:
        """Kept: a reader never accepts changes."""

    def journal_on(self) -> bool:
        return False

    def close(self) -> None:
        self._closed = True
