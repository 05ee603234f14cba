"""`MaintenanceQueue`: the one place the service's maintenance tasks wait, and the one
thread (`vault-maintenance`, a row of vault/runtime.py's table) that runs them.

Why a thread of its own: a task waits for the maintenance lock and then runs for as long
as its rate makes it (a compaction paced to 1 MiB/s over a large vault takes days). On the
worker pool each waiting admin request held a worker, so `compact?rate=1` and four queued
GCs filled a 4-thread pool and every tenant timed out. Here the routes and the schedule
only `submit` and await the future; a waiting request holds nothing but its connection.

Bounds: one task runs at a time (they would exclude each other on the lock anyway), and at
most `limit` wait behind it; a submit past that is refused at once with `MaintenanceBusy`
(409 `conflict`) rather than queued without end. The schedule submits only when the queue
is idle (`if_idle`), so it never piles up behind an operator's run; it skips and tries again
after its interval, as it did when it found the lock busy.

Stopping (`stop`, at SIGTERM): sets the event the long tasks check between steps and wake
on while pacing (vault/pacing.py), so a running compaction or scrub ends with
`MaintenanceStopped` (503) at its next step; tasks still queued fail with the same error
without running. `close` then joins the thread.

Every task runs through `maintenance.run` (the lock, the timing, the job log), as before.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from checkpoint_vault.vault import MaintenanceBusy, MaintenanceStopped, Vault
from checkpoint_vault.vault.runtime import Spawn

from .run import Recorder, run
from .tasks import Report

R = TypeVar("R", bound=Report)

# Tasks that may wait behind the running one: enough for an operator's burst (a GC, a
# check, a backup...), few enough that a flood is refused instead of queued for days.
QUEUE_LIMIT = 8
THREAD = "vault-maintenance"


@dataclass
class _Job:
    name: str
    task: Callable[[], Report]
    timeout: float | None
    future: Future[Any]


class MaintenanceQueue:
    """The queue of one vault's maintenance tasks and the thread that runs them in order."""

    def __init__(
        self,
        vault: Vault,
        spawn: Spawn,
        record: Recorder | None = None,
        limit: int = QUEUE_LIMIT,
    ) -> None:
        self.vault = vault
        self.record = record
        self.limit = limit
        # Set at shutdown; the running task's pacing waits on it (vault/pacing.py).
        self.stopping = threading.Event()
        self._cond = threading.Condition()
        self._queued: deque[_Job] = deque()
        self._running: str | None = None
        # Done when the thread has ended: what an event loop awaits instead of a join.
        self.finished: Future[None] = Future()
        self._thread = spawn(THREAD, self._loop)

    def submit(
        self,
        job: str,
        task: Callable[[], R],
        timeout: float | None = None,
        if_idle: bool = False,
    ) -> Future[R]:
        """Queue `task` (run as `maintenance.run(vault, job, task, timeout)`); its future
        answers the task's record or raises its error. `if_idle` (or `timeout=0`, which waits
        for nothing): refuse (`MaintenanceBusy`) unless nothing runs or waits. A full queue
        refuses too; a stopping one raises `MaintenanceStopped`."""
        future: Future[R] = Future()
        with self._cond:
            if self.stopping.is_set():
                raise MaintenanceStopped(f"{job}: the server is shutting down")
            busy = self._running or (self._queued[0].name if self._queued else None)
            if (if_idle or timeout == 0) and busy is not None:  # 0: wait for nothing
                raise MaintenanceBusy(f"{job}: maintenance is busy ({busy} is running)")
            if len(self._queued) >= self.limit:
                raise MaintenanceBusy(
                    f"{job}: {len(self._queued)} maintenance tasks are already waiting "
                    f"behind {busy}; retry later"
                )
            self._queued.append(_Job(job, task, timeout, future))
            self._cond.notify_all()
        return future

    @property
    def running(self) -> str | None:
        """The job running now, if any."""
        with self._cond:
            return self._running

    @property
    def queued(self) -> int:
        """How many tasks wait behind the running one."""
        with self._cond:
            return len(self._queued)

    def wait_for_queued(self, count: int, timeout: float) -> bool:
        """Block until at least `count` tasks wait (True) or `timeout` seconds pass (False):
        how a test knows its requests reached the queue, as `wait_for_waiters` tells it
        a task waits for the lock."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self._queued) >= count, timeout)

    def stop(self) -> None:
        """Stop: the running task at its next step, the queued ones without running
        (both `MaintenanceStopped`); no new submits. Returns at once."""
        with self._cond:
            self.stopping.set()
            dropped, self._queued = list(self._queued), deque()
            self._cond.notify_all()
        for job in dropped:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(
                    MaintenanceStopped(f"{job.name}: the server is shutting down")
                )

    def close(self, timeout: float | None = None) -> None:
        """`stop`, then wait up to `timeout` seconds for the thread. A task blocked where
        the event cannot wake it (waiting for another process's lock, a tier call) may
        outlive that: the thread is a daemon, and the runtime's close names it."""
        self.stop()
        self._thread.join(timeout)

    def _loop(self) -> None:
        try:
            self._serve()
        finally:
            self.finished.set_result(None)

    def _serve(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._queued) or self.stopping.is_set())
                if not self._queued:
                    return
                job = self._queued.popleft()
                if not job.future.set_running_or_notify_cancel():
                    continue  # its caller went away before it started
                self._running = job.name
                self._cond.notify_all()
            try:
                result = run(self.vault, job.name, job.task, job.timeout, self.record)
            except BaseException as e:  # the caller's error to handle, not this thread's
                job.future.set_exception(e)
            else:
                job.future.set_result(result)
            finally:
                with self._cond:
                    self._running = None
                    self._cond.notify_all()
