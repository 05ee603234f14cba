"""Durability behind the writer: LMDB commits without syncing, a thread syncs behind it.

A synced LMDB commit writes the transaction's pages, waits for them to reach the disk,
then writes the meta page and waits again. The writer thread used to do that for every
group commit, so while it waited nothing else was written, and while it wrote the disk sat
idle: a 1 GB upload ran at ~0.6x of a plain write + fsync of the same bytes. Now both
environments commit unsynced (MDB_NOSYNC) and the writer goes straight on to the next
batch; this thread makes each committed state durable and only then acknowledges the
batches that reached it (`after`). Acknowledged still means on disk.

Why the unsynced files stay recoverable. After a power loss an unsynced LMDB file may hold
a meta page whose tree never reached the disk, or pages of an older tree overwritten by
newer transactions. So:

1. right after each batch commits, the writer thread captures the state it left: both meta
   pages of each environment (read back from the file: no other writer can change them
   before its next commit) and a read transaction on each, a *pin*, which keeps LMDB from
   reusing any page that state can see, whatever commits later;
2. a cycle of this thread takes the newest captured state, fdatasyncs both data files, then
   writes that state's meta pages into a slot of the `durable` file (two alternating slots,
   each with its own digest) and syncs it; only then are the previous durable state's pins
   let go and the state's batches acknowledged;
3. recovery (`recover`, before LMDB opens the files) writes the durable slot's meta pages
   back. Every page of that tree was synced before the slot was written and pinned since,
   so each file is exactly its durable tree again; pages written after it are free or past
   its end. Both environments come back to the same moment, the end of one batch, so the
   crash invariants of docs/DESIGN.md hold across them.

A SIGKILL takes the same path (LMDB's newer pages are in the page cache, recovery rolls
them back to the durable state): every crash test exercises it. Unacknowledged batches
are lost either way, as before.

A batch whose callers were answered by its save-journal records (vault/journal.py) needs
no prompt cycle: its state waits up to `UNWAITED_DELAY` for the batches after it and one
cycle makes them all durable, as PostgreSQL flushes its WAL at each commit and its data
pages at checkpoints. A batch somebody waits for (a plain one, `wait_durable`, `quiesce`,
closing) starts a cycle at once, taking the waiting states with it.

The pins cost pages freed during one cycle (and the wait before it), which LMDB reuses a
cycle later instead of at once. Map growth needs every transaction of the process
closed: `quiesce` drains the cycles (everything committed durable), lets the pins go, then
pins and syncs the state again. After a failed sync nothing more is committed
(`failure`): the durable state's pages must stay as they are until a restart recovers it.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3

from .env import DATA_FILE, Env
from .errors import Conflict, Unavailable
from .files import fsync_dir
from .journal import Journal, discard_journal
from .ownership import open_private
from .runtime import Spawn

log = logging.getLogger(__name__)

DURABLE_FILE = "durable"  # in the vault dir, beside catalog/ and frames/
SLOT = 32 << 10  # one slot of the durable file; two alternate
_MAGIC = b"CVSYNC\x00\x02"
_SLOT_HEAD = struct.Struct("<8sQHIQ")  # magic, generation, environments, page size, journal
_MAGIC_V1 = b"CVSYNC\x00\x01"  # before the save journal: read, never written
_SLOT_HEAD_V1 = struct.Struct("<8sQHI")
_SLOT_ENV = struct.Struct("<Q")  # inode of the environment's data file
_DIGEST = 16

Done = Callable[[BaseException | None], None]  # told None once durable, or why not
# Seconds a state nobody waits for (its batch was acknowledged by its save-journal records)
# waits for later ones before a cycle makes it durable, as PostgreSQL's data pages wait for
# a checkpoint while its WAL acknowledges each commit. Syncing after every such batch cost
# ~0.1 ms of CPU a save under load, and its scattered writes shared the disk with the next
# save's journal sync (the latency of one client's saves); pages freed meanwhile are reused
# only after the cycle (the pins), which bounds how long the wait may be: 16 agents saving
# in one process, 4,800 saves: 432-579 cycles and 3.36-3.66 kB of disk a save (mean 3.49)
# without it; 327-349 and 3.46-3.63 (3.52) at 10 ms; 215-243 and 3.59-3.63 (3.61) at 20
# ms; at 50 ms (2,400 saves) 4.2 against 3.9-4.1. The disk may not grow: 10 ms.
UNWAITED_DELAY = 0.01


@dataclass(frozen=True)
class _Slot:
    generation: int
    psize: int
    inodes: list[int]  # of each environment's data file
    metas: list[bytes]  # both meta pages, per environment
    journal: int  # the newest save-journal record the state contains (vault/journal.py)


@dataclass
class _State:
    """What one batch left: the meta pages, the pins, who waits for it to be durable."""

    metas: list[bytes]
    pins: list[Any]  # read transactions (lmdb.Transaction)
    done: list[Done]
    journal: int = 0  # the newest journal record this state contains
    batch: int = 0  # the writer's number of the batch that left it


def _read_slot(raw: bytes) -> _Slot | None:
    if len(raw) >= _SLOT_HEAD.size and raw[:8] == _MAGIC:
        head = _SLOT_HEAD
        _, generation, n, psize, journal = head.unpack_from(raw)
    elif len(raw) >= _SLOT_HEAD_V1.size and raw[:8] == _MAGIC_V1:
        head, journal = _SLOT_HEAD_V1, 0
        _, generation, n, psize = head.unpack_from(raw)
    else:
        return None
    end = head.size + n * (_SLOT_ENV.size + 2 * psize)
    if (
        end + _DIGEST > len(raw)
        or blake3.blake3(raw[:end]).digest()[:_DIGEST] != raw[end : end + _DIGEST]
    ):
        return None
    inodes, metas = [], []
    pos = head.size
    for _ in range(n):
        inodes.append(int(_SLOT_ENV.unpack_from(raw, pos)[0]))
        pos += _SLOT_ENV.size
        metas.append(raw[pos : pos + 2 * psize])
        pos += 2 * psize
    return _Slot(generation, psize, inodes, metas, journal)


def _slots(raw: bytes) -> list[_Slot | None]:
    return [_read_slot(raw[i * SLOT : (i + 1) * SLOT]) for i in (0, 1)]


def _durable_slot(raw: bytes) -> tuple[int, _Slot] | None:
    """The valid slot with the higher generation, and its index (a torn slot write leaves
    the other one in force)."""
    valid = [(i, s) for i, s in enumerate(_slots(raw)) if s is not None]
    return max(valid, key=lambda v: v[1].generation) if valid else None


def _restore_metas(durable: Path, data: Path, inode: int, metas: bytes) -> None:
    """Write a durable state's meta pages back into `data`. Pages already equal to them:
    nothing to do (a clean close), whichever file this is. Else it must be the file the
    state was taken of: meta pages written into another file would corrupt it."""
    try:
        fd = open_private(data, os.O_RDWR)
    except FileNotFoundError:
        return  # the environment is gone (a lost frames dir): LMDB starts it afresh
    try:
        if os.pread(fd, len(metas), 0) == metas:
            return
        if os.fstat(fd).st_ino != inode:
            raise Conflict(
                f"{durable} was written for another {data.name} than {data} (a restored or "
                "copied file?); remove it only if that file is known to be complete"
            )
        os.pwrite(fd, metas, 0)
        os.fdatasync(fd)
    finally:
        os.close(fd)


def recover(durable: Path, env_dirs: Sequence[Path]) -> None:
    """Put each environment back to the last durable state (before LMDB opens them). A data
    dir without the file (new, or from a version that synced every commit) has nothing to
    do."""
    try:
        raw = durable.read_bytes()
    except FileNotFoundError:
        return
    found = _durable_slot(raw)
    if found is None:
        return  # never completed a first cycle: LMDB was synced when it was opened
    slot = found[1]
    if len(env_dirs) != len(slot.inodes):
        raise Conflict(f"{durable} covers {len(slot.inodes)} environments, not {len(env_dirs)}")
    for d, inode, metas in zip(env_dirs, slot.inodes, slot.metas, strict=True):
        _restore_metas(durable, d / DATA_FILE, inode, metas)


class Syncer:
    """Makes the environments' committed states durable, in order, on its own thread.

    `envs` are opened unsynced and recovered (`recover`) by the caller; whatever was
    written to them before this is made the first durable state here."""

    def __init__(self, path: Path, envs: Sequence[Env], journal_dir: Path, spawn: Spawn) -> None:
        self._path = path
        self._envs = list(envs)
        self._fd = open_private(path, os.O_RDWR | os.O_CREAT)
        self._data_fds = [open_private(e.path / DATA_FILE, os.O_RDONLY) for e in self._envs]
        self._psize = int(self._envs[0].lmdb.stat()["psize"])
        raw = os.pread(self._fd, 2 * SLOT, 0)
        found = _durable_slot(raw)
        self._generation = found[1].generation if found is not None else 0
        self._slot = found[0] if found is not None else 1  # the next cycle writes the other
        if found is None:  # no state its records were written over (new, or restored files)
            discard_journal(journal_dir)
        self.journal = Journal(journal_dir, found[1].journal if found is not None else 0)
        self._cond = threading.Condition()
        self._queue: list[_State] = []
        self._urgent = False  # a queued state has callers waiting for it: cycle at once
        self._due = 0.0  # time.monotonic() by which the queued states get their cycle
        self._hurry = 0  # callers of `quiesce` waiting for everything to be durable
        self._busy = False  # a cycle is running
        self._failure: BaseException | None = None
        self._closing = False
        self.cycles = 0
        first = self.capture([])
        self._durable: _State = first
        self._make_durable(first.metas, [b""] * len(self._envs), first.journal)
        if found is None:  # a new durable file: its directory entry must last too
            fsync_dir(path.parent)
        self._thread = spawn("vault-syncer", self._run)

    @property
    def failure(self) -> BaseException | None:
        """Why nothing can be made durable any more (a sync failed), or None."""
        return self._failure

    @property
    def durable_batch(self) -> int:
        """The writer's number of the newest batch known durable."""
        return self._durable.batch

    def capture(self, done: list[Done], batch: int = 0) -> _State:
        """The state the writer just committed (writer thread, before its next commit):
        its batch `batch` and every journal record applied so far."""
        pins: list[Any] = []
        try:
            for e in self._envs:
                pins.append(e.lmdb.begin())
            metas = [os.pread(fd, 2 * self._psize, 0) for fd in self._data_fds]
        except BaseException:
            _release(pins)
            raise
        return _State(metas, pins, done, self.journal.applied, batch)

    def after(self, done: Done, batch: int = 0, *, waited: bool = True) -> None:
        """Writer thread, right after batch `batch` committed: call `done(None)` on this
        thread once the state it left is durable (`done(error)` if it cannot be).
        `waited=False`: nobody waits for it (journaled), so its cycle may come up to
        UNWAITED_DELAY later, with those of the batches after it."""
        state = self.capture([done], batch)
        with self._cond:
            if self._failure is None:
                wake = waited or not self._queue
                if self._queue:  # the next cycle makes only the newest state durable: the
                    _release(self._queue[-1].pins)  # pins stay three states' however slow
                    self._queue[-1].pins = []  # the disk (LMDB's reader slots are few)
                else:
                    self._due = time.monotonic() + UNWAITED_DELAY
                self._queue.append(state)
                self._urgent = self._urgent or waited
                if wake:
                    self._cond.notify_all()
                return
            failure = self._failure
        _release(state.pins)
        done(failure)

    @contextmanager
    def quiesce(self) -> Iterator[None]:
        """Writer thread: everything committed durable and no pin held, for the body (map
        growth); the state is pinned and made durable again after it."""
        with self._cond:
            self._hurry += 1
            self._cond.notify_all()
            try:
                while self._queue or self._busy:
                    self._cond.wait()
            finally:
                self._hurry -= 1
        _release(self._durable.pins)
        self._durable.pins = []
        try:
            yield
        finally:
            # Usually the state the pins held; but a commit whose capture failed was never
            # synced, and only a synced, pinned state may be the one recovery returns to.
            self.sync_now()

    def sync_now(self) -> None:
        """Make the current state durable on the calling thread, with no cycle running:
        the writer's, or before it starts (what opening the vault wrote directly)."""
        state = self.capture([], self._durable.batch)
        if self._sync(state) is None:
            _release(self._durable.pins)
        self._durable = state

    def close(self) -> None:
        """Make everything committed durable, then stop (after the writer stopped)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        _release(self._durable.pins)
        self.journal.close()
        for fd in (self._fd, *self._data_fds):
            os.close(fd)

    def _run(self) -> None:
        while True:
            with self._cond:
                while (wait := self._wait()) != 0.0:
                    self._cond.wait(wait)
                if not self._queue:
                    return
                states, self._queue = self._queue, []
                self._urgent = False
                self._busy = True
            try:
                self._cycle(states)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _wait(self) -> float | None:
        """Under the lock: 0.0 if a cycle (or the end) is due now, else how long to wait
        for one (None: until told)."""
        if not self._queue:
            return 0.0 if self._closing else None
        if self._urgent or self._closing or self._hurry:
            return 0.0
        return max(0.0, self._due - time.monotonic()) or 0.0

    def _cycle(self, states: list[_State]) -> None:
        """Make the newest of `states` durable, then tell every one of them, in order."""
        target = states[-1]  # the older states' pins were let go when a newer one came
        error = self._sync(target)
        if error is None:
            _release(self._durable.pins)
            self._durable = target
            try:
                self.journal.trim(target.journal)
            except OSError:  # noqa: PERF203 - kept files are read again, skipped, trimmed later
                log.exception("deleting journal files a durable state covers failed")
        else:
            _release(target.pins)
        for s in states:
            for done in s.done:
                try:
                    done(error)
                except Exception:  # noqa: BLE001 - one caller's trouble stops no other
                    log.exception("acknowledging a batch failed")

    def _sync(self, state: _State) -> BaseException | None:
        """Make `state` durable; the failure every waiter must hear of, if that fails now or
        failed before (Linux may have dropped the pages of a failed sync)."""
        if self._failure is None:
            try:
                self._make_durable(state.metas, self._durable.metas, state.journal)
            except Exception as e:  # noqa: BLE001 - handed to every waiter
                log.exception("syncing the data files failed")
                with self._cond:
                    self._failure = Unavailable(
                        f"a sync to disk failed ({e}); restart the service: it recovers the "
                        "last durable state"
                    )
        return self._failure

    def _make_durable(self, metas: list[bytes], before: list[bytes], journal: int) -> None:
        """Sync the data files that changed since `before`, then record `metas` (and the
        journal record they contain) as the durable state (the slot not in force, then
        synced)."""
        for fd, new, old in zip(self._data_fds, metas, before, strict=True):
            if new != old:
                os.fdatasync(fd)
        parts = [
            _SLOT_HEAD.pack(_MAGIC, self._generation + 1, len(self._envs), self._psize, journal)
        ]
        for fd, meta in zip(self._data_fds, metas, strict=True):
            parts.append(_SLOT_ENV.pack(os.fstat(fd).st_ino))
            parts.append(meta)
        slot = b"".join(parts)
        slot += blake3.blake3(slot).digest()[:_DIGEST]
        os.pwrite(self._fd, slot, (self._slot ^ 1) * SLOT)
        os.fdatasync(self._fd)
        self._slot ^= 1
        self._generation += 1
        self.cycles += 1


def _release(pins: list[Any]) -> None:
    for txn in pins:
        txn.abort()
