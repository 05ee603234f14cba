"""The maintenance lock: one long operation at a time on a vault, across threads and processes.

It is taken in two places. `maintenance.run` (maintenance/run.py) holds it around each whole
task (gc with its repack, check, verify, retention, compaction, the tiering run, catalog
backup), and every caller runs tasks through it: the schedule, the admin routes (through the
maintenance queue) and the offline `ckpt` commands; the engine's operations themselves
(`Vault.gc`, `tiering.repack`, ...) assume their caller holds it, so a task holds it once,
under its own name, and the lock is not spread over each entry point. The offline restores
(vault/backup.py, vault/replication/restore.py), which have no open vault, take it through
`offline_hold`. Two reasons to exclude: repack deletes packs nothing points to, which is
only safe while no demotion is between its upload and its switch; and each operation is a
long scan, two at once would only slow producers down.

The lock is two locks: a `threading.Condition`-guarded owner slot for the threads of this
process (an flock is per open file, so threads sharing one would not exclude each other),
then `fcntl.flock` on `<vault dir>/maintenance.lock` for other processes. The kernel drops
the flock when its process dies, so a SIGKILLed holder never blocks its successor. While
held, the file says which process holds it for what (shown in the busy error).

It is reentrant within one thread: a test or tool may hold it around a task that
`maintenance.run` then holds again without waiting.

`timeout=None` waits as long as it takes; `timeout=0` does not wait; otherwise waits up to
that many seconds. Giving up raises `MaintenanceBusy` (409 `conflict`). Waiting blocks the
calling thread: async callers run operations on a worker thread, never on the event loop.

The lock counts the threads of this process waiting for it (for either half), and a caller
can block until that many wait (`wait_for_waiters`): how a test knows an operation is
blocked on the lock, where sleeping and finding it unfinished would prove nothing. The
owner slot's condition is notified to all, since such a caller waits on it too.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import IO

from .errors import MaintenanceBusy
from .ownership import open_private

LOCK_FILE = "maintenance.lock"
POLL = 0.05  # seconds between flock attempts while waiting with a time limit


class MaintenanceLock:
    """The maintenance lock of the vault whose directory holds `path` (see module doc)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._cond = threading.Condition()
        self._owner: int | None = None  # thread ident of the holder in this process
        self._depth = 0
        self._operation = ""
        self._file: IO[bytes] | None = None
        self._waiters = 0  # threads of this process blocked in _acquire, either half

    @classmethod
    def of(cls, vault_dir: Path) -> MaintenanceLock:
        return cls(vault_dir / LOCK_FILE)

    @property
    def held(self) -> bool:
        """Some thread of this process holds it (other processes are not asked)."""
        with self._cond:
            return self._owner is not None

    @property
    def waiters(self) -> int:
        """How many threads of this process wait for the lock right now."""
        with self._cond:
            return self._waiters

    def wait_for_waiters(self, count: int, timeout: float) -> bool:
        """Block until at least `count` threads of this process wait for the lock (True),
        or `timeout` seconds pass (False)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._waiters >= count, timeout)

    @contextmanager
    def _waiting(self) -> Iterator[None]:
        """Count the calling thread among the waiters while it waits."""
        with self._cond:
            self._waiters += 1
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._waiters -= 1

    @contextmanager
    def hold(self, operation: str, timeout: float | None = None) -> Iterator[None]:
        """Hold the lock for `operation` (a name for messages), waiting as `timeout` says."""
        self._acquire(operation, timeout)
        try:
            yield
        finally:
            self._release()

    def _acquire(self, operation: str, timeout: float | None) -> None:
        me = threading.get_ident()
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return
            while self._owner is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise MaintenanceBusy(
                        f"{operation}: maintenance is busy ({self._operation} is running "
                        "in this process); retry later"
                    )
                self._waiters += 1
                self._cond.notify_all()
                try:
                    self._cond.wait(left)
                finally:
                    self._waiters -= 1
            self._owner, self._depth, self._operation = me, 1, operation
        try:
            self._file = self._flock(operation, deadline)
        except BaseException:
            with self._cond:
                self._owner, self._depth, self._operation = None, 0, ""
                self._cond.notify_all()
            raise

    def _release(self) -> None:
        with self._cond:
            self._depth -= 1
            if self._depth:
                return
            if self._file is not None:
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
                self._file.close()
                self._file = None
            self._owner, self._operation = None, ""
            self._cond.notify_all()

    def _flock(self, operation: str, deadline: float | None) -> IO[bytes]:
        """The cross-process half, taken by the thread that owns the in-process half."""
        f = os.fdopen(open_private(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND), "a+b")
        try:
            if not _try_flock(f):
                self._wait_for_flock(f, operation, deadline)
            f.truncate(0)
            f.write(f"{os.getpid()} {operation}\n".encode())
            f.flush()
        except BaseException:
            f.close()
            raise
        return f

    def _wait_for_flock(self, f: IO[bytes], operation: str, deadline: float | None) -> None:
        """Another process holds the lock: wait for it, counted among the waiters, as
        `deadline` says (None: as long as it takes; passed: not at all)."""
        if deadline is not None and deadline <= time.monotonic():
            raise MaintenanceBusy(f"{operation}: maintenance is busy ({_holder(f)}); retry later")
        with self._waiting():
            if deadline is None:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
                return
            while not _try_flock(f):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise MaintenanceBusy(
                        f"{operation}: maintenance is busy ({_holder(f)}); retry later"
                    )
                time.sleep(min(POLL, left))  # polling: flock has no timeout of its own


def _try_flock(f: IO[bytes]) -> bool:
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _holder(f: IO[bytes]) -> str:
    """What the holding process wrote into the lock file: its pid and operation."""
    f.seek(0)
    pid, _, operation = f.read(200).decode(errors="replace").strip().partition(" ")
    if not pid:
        return "held by another process"
    return f"{operation or 'an operation'} is running in process {pid}"


def offline_hold(vault_dir: Path, operation: str) -> AbstractContextManager[None]:
    """The lock of a data dir no process has open (a restore into it), taken without waiting:
    a holder means something still uses the directory, so the restore is refused
    (`MaintenanceBusy`) rather than queued behind it."""
    return MaintenanceLock.of(vault_dir).hold(operation, timeout=0)
