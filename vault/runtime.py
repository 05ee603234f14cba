"""`Runtime`: every thread pool and dedicated thread of one server process, in one place.

A newcomer (or an operator reading a stack dump) should find each thread's purpose, bound
and shutdown in one table: `THREADS` below, mirrored in docs/DESIGN.md and checked by a
test. Pools are sized from `PoolSizes` (the service fills it from settings); dedicated
threads are started through `thread`, so the runtime knows them too. `close` is the one
shutdown order: request pools first (no new engine calls), then the engine's own pools,
then the engine itself (`engine_close`: standby, replication, writer, syncer, LMDB), and
last a check that no thread the runtime started outlived it.

The engine does not create threads of its own: `Store`, `Writer`, `Syncer` and the
replication threads take theirs from a runtime. A vault opened without one (tests, offline
tools) gets a private runtime that its `close` closes.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from .libc import set_thread_name

log = logging.getLogger("ckpt.runtime")

# A dedicated thread is started by its owner, through the runtime: `spawn(name, target)`.
Spawn = Callable[[str, Callable[[], None]], threading.Thread]


@dataclass(frozen=True)
class ThreadKind:
    """One row of the runtime's table: a pool (bounded) or a dedicated thread (one)."""

    name: str  # thread name, or the pool's thread-name prefix
    pool: bool
    runs: str
    bound: str
    waits_on: str
    on_sigterm: str


THREADS: tuple[ThreadKind, ...] = (
    ThreadKind(
        "vault-io",
        True,
        "engine calls of request handlers (records, listings, commits...)",
        "`worker_threads` (default 16)",
        "LMDB reads, the writer's acknowledgement",
        "finishes the calls under way, takes no new one",
    ),
    ThreadKind(
        "vault-send",
        True,
        "copying download bodies to sockets",
        "128 (started on demand)",
        "the client's socket",
        "a stalled client is let go after STALL_SECONDS",
    ),
    ThreadKind(
        "vault-receive",
        True,
        "reading large request bodies (chunk batches, bundles)",
        "64, `receivers_per_token` (16) per token",
        "the client's socket, until a deadline its length sets",
        "woken by the aborted handler; returns at once",
    ),
    ThreadKind(
        "vault-handover",
        True,
        "reading and writing files handed over by descriptor",
        "8, `handovers_per_token` (2) per token",
        "the file (pread / pwrite), until a deadline its allocated bytes set",
        "told to stop; stops at its next piece; one blocked in the kernel 10 s on is left "
        "behind and the process exits without it",
    ),
    ThreadKind(
        "ckpt-decode",
        True,
        "decoding delta chains of one read batch side by side",
        "min(4, CPUs)",
        "zstd / numpy (GIL released)",
        "idle once the request pools are",
    ),
    ThreadKind(
        "ckpt-store",
        True,
        "storing the pieces of a handed-over file while the next is cut",
        "4",
        "the writer's queue",
        "idle once the hand-over pool is",
    ),
    ThreadKind(
        "vault-writer",
        False,
        "every LMDB write transaction, in group-committed batches",
        "1",
        "its queue",
        "commits what is queued, then stops",
    ),
    ThreadKind(
        "vault-syncer",
        False,
        "making committed states durable (fdatasync, journal)",
        "1",
        "the writer's commits",
        "syncs the last state, then stops",
    ),
    ThreadKind(
        "vault-replica-log",
        False,
        "shipping the change log to the replica tier",
        "1 with `[replication]`",
        "the tier (object store)",
        "ships what is committed (10 s at most), then stops",
    ),
    ThreadKind(
        "vault-replica-base",
        False,
        "uploading base snapshots of the catalog",
        "1 with `[replication]`",
        "the tier",
        "stops; a partial base is never named",
    ),
    ThreadKind(
        "vault-maintenance",
        False,
        "maintenance tasks of the admin routes and the schedule, one at a time "
        "(GC, compaction, scrub...), from one queue",
        "1; 8 tasks queued behind it",
        "the maintenance lock, its rate's pacing",
        "queued tasks dropped; a running GC, check, scrub, compaction or tiering run "
        "stops at its next step (503), others finish",
    ),
    ThreadKind(
        "vault-close",
        False,
        "the shutdown order itself (`Runtime.close_in_thread`)",
        "1, at shutdown",
        "every other thread",
        "is what SIGTERM starts",
    ),
    ThreadKind(
        "vault-fetch",
        True,
        "a standby's reads of the replica's segments, one ahead of the one it applies",
        "2",
        "the tier (object store)",
        "idle once the standby stops; shut down after it",
    ),
    ThreadKind(
        "vault-standby",
        False,
        "a standby applying the replica's log",
        "1 on a standby",
        "the tier, the writer",
        "stops after the segment under way",
    ),
)


def os_name(name: str) -> None:
    """Give the calling thread `name` in the kernel too (15 bytes), so `top -H`, `ps -L`
    and /proc/PID/task/*/comm tell the writer from the loop from a pool: Python 3.11 names
    only its own thread objects."""
    set_thread_name(name)  # not Linux: Python's name only


def _named(name: str, target: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        os_name(name)
        target()

    return run


def _pool(size: int, prefix: str) -> ThreadPoolExecutor:
    """A pool whose threads carry `prefix` in Python and in the kernel."""
    return ThreadPoolExecutor(
        size, thread_name_prefix=prefix, initializer=os_name, initargs=(prefix,)
    )


@dataclass(frozen=True)
class PoolSizes:
    """How many threads each pool may start (its bound; threads start on demand, and more
    work waits its turn); the service fills `io` from settings (`worker_threads`, 16 by
    default), a vault opened without the service keeps 4."""

    io: int = 4
    # Downloads sending at once.
    send: int = 128
    # Bodies received at once; more wait in the kernel's socket buffers. Apart from the
    # senders, so stalled uploads cannot hold up reads.
    receive: int = 64
    # Files handed over by descriptor read or written at once (each holds a few 8 MiB
    # pieces or 4 MiB batches). Their own threads: a file takes a thread for as long as it
    # takes, and on the worker pool a few large ones would leave every request waiting.
    handover: int = 8
    decode: int = max(1, min(4, os.cpu_count() or 1))
    store: int = 4
    # A standby's segment fetches (one ahead, and a rebuild's): each GET is a round trip.
    fetch: int = 2


# How long `close` waits for hand-over threads once the stop is set. They look at it
# between pieces of 8 MiB (well under a second on any disk); one still busy after this is
# blocked in a system call no stop can interrupt.
HANDOVER_GRACE = 10.0


class Runtime:
    """The pools of one process, and the dedicated threads started through it."""

    def __init__(self, sizes: PoolSizes | None = None) -> None:
        s = sizes or PoolSizes()
        self.sizes = s
        self.io = _pool(s.io, "vault-io")
        self.send = _pool(s.send, "vault-send")
        self.receive = _pool(s.receive, "vault-receive")
        self.handover = _pool(s.handover, "vault-handover")
        # Delta chains decode side by side (zstd and numpy release the GIL): one core
        # decodes a chain 8 deep at ~150 MB/s.
        self.decode = _pool(s.decode, "ckpt-decode")
        # Long-lived, so the malloc arena each thread gets is reused rather than one more
        # kept per handed-over file.
        self.store = _pool(s.store, "ckpt-store")
        self.fetch = _pool(s.fetch, "vault-fetch")
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False
        self.handover_grace = HANDOVER_GRACE
        self.stuck: list[str] = []  # hand-over threads `close` could not wait for

    def thread(self, name: str, target: Callable[[], None]) -> threading.Thread:
        """Start a dedicated thread named `name` (a row of THREADS). Its owner stops and
        joins it; a daemon, so a thread stuck on a dead object store cannot hold exit."""
        if name not in _DEDICATED:
            raise ValueError(f"{name!r} is not a thread of the runtime's table")
        t = threading.Thread(target=_named(name, target), name=name, daemon=True)
        with self._lock:
            self._threads = [x for x in self._threads if x.is_alive()]
            self._threads.append(t)
        t.start()
        return t

    def owns(self, thread: threading.Thread) -> bool:
        """Is `thread` one of this runtime's (a pool's worker or a dedicated thread)?"""
        with self._lock:
            if thread in self._threads:
                return True
        pools = (
            self.io, self.send, self.receive, self.handover, self.decode, self.store, self.fetch
        )  # fmt: skip
        return any(thread in p._threads for p in pools)  # noqa: SLF001 - no public view

    def live(self) -> list[threading.Thread]:
        """Every live thread the runtime started."""
        return [t for t in threading.enumerate() if self.owns(t)]

    def close(self, engine_close: Callable[[], None] = lambda: None) -> None:
        """The one shutdown order (idempotent). Request pools first: the handlers were
        cancelled and bodies aborted, so they finish what is under way and take nothing
        new; then the engine's pools, idle by then; then `engine_close` (the owners stop
        and join their dedicated threads, the writer commits what is queued, LMDB closes).

        The hand-over pool is waited for `handover_grace` seconds only: its threads read
        and write files callers own, and look at the stop between pieces, so one still
        running by then is blocked in the kernel (a FUSE or network file that never
        answers) and no wait would end. It is left in `stuck`; the process exits without
        it (`exit_if_stuck`), the engine closed first."""
        if self._closed:
            return
        self._closed = True
        for pool in (self.send, self.receive):
            pool.shutdown(wait=True)
        self.stuck = _drain(self.handover, self.handover_grace)
        if self.stuck:
            log.error(
                "hand-over threads blocked in a file's read or write for %.0f s after the"
                " stop, left behind: %s",
                self.handover_grace,
                ", ".join(self.stuck),
            )
        for pool in (self.io, self.decode, self.store):
            pool.shutdown(wait=True)
        engine_close()
        self.fetch.shutdown(wait=True)  # after the standby that submits to it has stopped
        me = threading.current_thread()
        left = [t.name for t in self._threads if t.is_alive() and t is not me]
        if left:  # a replication thread stuck on a dead store: a daemon, exit goes on
            log.warning("threads still running at close: %s", ", ".join(left))

    def close_in_thread(self, engine_close: Callable[[], None]) -> Future[None]:
        """`close` on a thread of its own, for the event loop: closing waits on threads that
        may need the loop (a download's pin is let go by a callback on it). The future is
        running from the start, so it cannot be cancelled: a waiter cancelled meanwhile (by
        a second SIGTERM, through `asyncio.wrap_future`) used to cancel it, and the thread's
        `set_result` then raised `InvalidStateError: CANCELLED` on the terminal."""
        done: Future[None] = Future()
        done.set_running_or_notify_cancel()

        def run() -> None:
            try:
                self.close(engine_close)
            except BaseException as e:
                done.set_exception(e)
            else:
                done.set_result(None)

        self.thread("vault-close", run)
        return done


_DEDICATED = frozenset(k.name for k in THREADS if not k.pool)


def _drain(pool: ThreadPoolExecutor, grace: float) -> list[str]:
    """Shut `pool` down, waiting at most `grace` seconds for its threads; the names of
    those still running after."""
    pool.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + grace
    threads = list(pool._threads)  # noqa: SLF001 - no public view
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in threads if t.is_alive()]


def exit_if_stuck(runtime: Runtime) -> None:
    """End the process now if `close` left hand-over threads behind: Python's exit joins
    every pool thread and would wait on them forever. The engine is closed and everything
    committed is durable by then; only the logs are flushed first."""
    if runtime.stuck:
        logging.shutdown()
        os._exit(0)
