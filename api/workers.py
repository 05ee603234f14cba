"""Several server processes on one data dir: the one that writes starts and keeps the rest.

`ckpt serve` is the writing process: it opens the vault as ever (writer, syncer, save
journal, maintenance, replication, the schedule) and serves the local socket and the
engine socket. It then starts `Settings.answering` workers (`python -m node.worker`), each
with its own event loop, interpreter and pools, which accept on listening sockets bound to
the same port (SO_REUSEPORT, made here and inherited: api/serve.py), open the vault to
read (`Vault(reader=True)`), prepare one-request saves and forward every other change to
the writing process (api/forward.py, api/calls.py). The writing process answers nothing
on the port: its interpreter lock is the writer's (answering too, its HTTP work doubled
the wall time of the writer's transactions, docs/SCALING.md). So HTTP parsing,
authentication, JSON, cutting and hashing and the reads themselves use every core, while
every write still goes through one writer, one group commit and one journal, and every
crash invariant of docs/DESIGN.md holds unchanged.

Lifetimes, and why each is safe:
- A worker dies with the writing process (PR_SET_PDEATHSIG, SIGKILL): a worker must never
  read across the recovery a restart runs, which rewrites the files' meta pages.
- Each worker holds `workers.lock` shared; a starting writer takes it exclusively before
  it recovers anything, so a worker of a killed predecessor that has not died yet is
  waited for (`no_readers`), never read beside.
- A worker that exits is started again: at once if it had got ready to serve, else after
  a pause that doubles while it keeps failing to start (up to RESTART_MAX seconds). The
  reader slots it held in LMDB's lock table are cleared first (`mdb_reader_check`), else
  they would keep old pages from reuse.
- At SIGTERM the writer asks every worker to stop (they finish their requests like it
  does), waits for them, then closes the vault.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from aiohttp import web

from checkpoint_vault.vault import Unavailable
from checkpoint_vault.vault.libc import signal_on_parent_death
from checkpoint_vault.vault.ownership import open_private

from .keys import LISTENING, SETTINGS, VAULT
from .settings import Settings

log = logging.getLogger("ckpt.api")

READERS_LOCK = "workers.lock"  # in the vault dir: held shared by every worker
READERS_WAIT = 15.0  # seconds a starting writer waits for a predecessor's workers to die
RESTART_MIN, RESTART_MAX = 0.5, 30.0
READY_WAIT = 60.0  # seconds a starting service waits for its workers to open the vault


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker process is told on its standard input (pickled)."""

    settings: Settings
    index: int  # 1.. (0 is the writing process)
    instance: str  # the service's, so every process answers health alike
    listening: list[int]  # descriptors of this worker's listening sockets, inherited
    ready: int  # a pipe's write end: one byte once the worker is ready to serve
    go: int  # a pipe's read end: one byte once it may accept (every worker is ready)
    parent: int  # the writer's pid: a worker that finds another parent exits


def readers_lock(settings: Settings) -> Path:
    return settings.data_dir / "vault" / READERS_LOCK


@contextmanager
def no_readers(settings: Settings) -> Iterator[None]:
    """Hold `workers.lock` exclusively: no worker of an earlier writer is still reading.
    Waits up to READERS_WAIT seconds (they die with their writer, within milliseconds)."""
    path = readers_lock(settings)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with os.fdopen(open_private(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab") as f:
        deadline = time.monotonic() + READERS_WAIT
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise Unavailable(
                        f"{path.parent} is still read by worker processes of an earlier "
                        "server; stop them first"
                    ) from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def hold_shared(settings: Settings) -> IO[bytes]:
    """A worker's share of `workers.lock`, for its life (the kernel drops it at exit)."""
    f = os.fdopen(
        open_private(readers_lock(settings), os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab"
    )
    fcntl.flock(f.fileno(), fcntl.LOCK_SH)
    return f


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent dies; exit now if it already has."""
    signal_on_parent_death(signal.SIGKILL)  # not Linux: the worker outlives a SIGKILL
    if os.getppid() != parent:
        os._exit(1)


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    pause: float = RESTART_MIN
    served: bool = False  # it got ready: a death after that is no start-up crash loop
    pidfd: int = -1
    go: int = -1  # the write end of its `WorkerSpec.go` pipe until it is let accept
    gone: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Workers:
    """The writer's workers: started, watched, started again, stopped."""

    settings: Settings
    instance: str
    listening: list[list[int]]  # each worker's listening sockets (api/serve.py)
    forget_readers: Callable[[], object]  # clear dead readers' slots in LMDB's lock table
    _workers: list[_Worker] = field(default_factory=list)
    _stopping: bool = False
    _open: bool = False  # every worker got ready (or READY_WAIT passed): they accept

    async def start(self) -> None:
        """Start every worker, wait until each has opened the vault (READY_WAIT at most),
        then let them all accept: a service that answers on the port is one whose
        processes all answer (the first one ready would otherwise take every connection
        made meanwhile, and a caller would see one process where it asked for several)."""
        count = self.settings.processes - 1
        self._workers = [_Worker(i) for i in range(1, count + 1)]
        ready = [self._spawn(w) for w in self._workers]
        _, late = await asyncio.wait(ready, timeout=READY_WAIT)
        for future in late:
            future.cancel()
        self._open = True
        for w in self._workers:
            if w.served:
                self._let_accept(w)
        log.info(
            "serving with %d processes (this one writes; %d workers answer on the port%s)",
            count + 1,
            count,
            f", {len(late)} not ready after {READY_WAIT:.0f} s" if late else "",
        )

    def _spawn(self, w: _Worker) -> asyncio.Future[None]:
        """Start worker `w`; the future resolves once it is ready to serve."""
        fds = self.listening[w.index - 1]
        loop = asyncio.get_running_loop()
        ready_read, ready_write = os.pipe()
        go_read, w.go = os.pipe()
        spec = WorkerSpec(
            self.settings, w.index, self.instance, fds, ready_write, go_read, os.getpid()
        )
        try:
            proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                [sys.executable, "-m", "checkpoint_vault.node.worker"],
                stdin=subprocess.PIPE,
                pass_fds=[*fds, ready_write, go_read],
            )
        finally:
            os.close(ready_write)
            os.close(go_read)
        ready: asyncio.Future[None] = loop.create_future()

        def readable() -> None:  # a byte once ready, or end of file if it died first
            loop.remove_reader(ready_read)
            w.served = os.read(ready_read, 1) == b"1"
            os.close(ready_read)
            if w.served and self._open:  # started again: the others already accept
                self._let_accept(w)
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(ready_read, readable)
        assert proc.stdin is not None
        proc.stdin.write(pickle.dumps(spec))
        proc.stdin.close()
        w.proc, w.started, w.served = proc, time.monotonic(), False
        w.gone.clear()
        w.pidfd = os.pidfd_open(proc.pid)
        loop.add_reader(w.pidfd, self._exited, w)
        return ready

    @staticmethod
    def _let_accept(w: _Worker) -> None:
        """Tell worker `w` to start accepting on its sockets (closing the pipe, if it
        died meanwhile, is all that is left to do)."""
        if w.go < 0:
            return
        with suppress(OSError):  # EPIPE: it died; _exited starts it again
            os.write(w.go, b"1")
        os.close(w.go)
        w.go = -1

    def _exited(self, w: _Worker) -> None:
        loop = asyncio.get_running_loop()
        if w.go >= 0:
            os.close(w.go)
            w.go = -1
        loop.remove_reader(w.pidfd)
        os.close(w.pidfd)
        w.pidfd = -1
        assert w.proc is not None
        code = w.proc.wait()
        w.gone.set()
        if self._stopping:
            return
        lived = time.monotonic() - w.started
        log.warning(
            "worker %d (pid %d) exited with %s after %.1f s; starting it again",
            w.index,
            w.proc.pid,
            code,
            lived,
        )
        self.forget_readers()
        if w.served:  # killed, or failed while serving: back at once
            w.pause = RESTART_MIN
            loop.call_soon(self._respawn, w)
        else:  # failing to start: each try waits twice as long as the last
            loop.call_later(w.pause, self._respawn, w)
            w.pause = min(RESTART_MAX, w.pause * 2)

    def _respawn(self, w: _Worker) -> None:
        if not self._stopping:
            self._spawn(w)  # serves once ready; meanwhile the other processes do

    def pids(self) -> list[int]:
        """The workers running now."""
        return [w.proc.pid for w in self._workers if w.proc is not None and w.pidfd >= 0]

    def stop(self) -> None:
        """Ask every worker to finish its requests and exit (SIGTERM), once: a second SIGTERM
        cut a worker's own shutdown short (tracebacks, exit 1); none is restarted."""
        if self._stopping:
            return
        self._stopping = True
        for w in self._workers:
            if w.proc is not None and w.pidfd >= 0:
                w.proc.send_signal(signal.SIGTERM)

    async def wait(self, timeout: float) -> None:
        """Wait for the workers to exit; SIGKILL those still running after `timeout`."""
        running = [w for w in self._workers if w.proc is not None and w.pidfd >= 0]
        if not running:
            return
        waits = [asyncio.ensure_future(w.gone.wait()) for w in running]
        _, late = await asyncio.wait(waits, timeout=timeout)
        for task in late:
            task.cancel()
        for w in running:
            if not w.gone.is_set() and w.proc is not None:
                log.warning("worker %d did not stop in %.0f s; killing it", w.index, timeout)
                w.proc.kill()
                w.proc.wait()
                asyncio.get_running_loop().remove_reader(w.pidfd)
                os.close(w.pidfd)
                w.pidfd = -1


WORKERS = web.AppKey("workers", Workers)


def workers_context(instance: str) -> Callable[[web.Application], AsyncIterator[None]]:
    """The cleanup context that runs the workers of the writing process: started once the
    vault is open, stopped (and waited for) before it closes."""

    async def context(app: web.Application) -> AsyncIterator[None]:
        settings = app[SETTINGS]
        listening = [[s.fileno() for s in group] for group in app[LISTENING]]
        workers = Workers(settings, instance, listening, app[VAULT].forget_dead_readers)
        app[WORKERS] = workers
        try:
            await workers.start()  # inside: a SIGTERM while they start stops them too
            yield
        finally:
            workers.stop()
            await workers.wait(settings.shutdown_timeout + 5)

    return context


def worker_pids(app: web.Application) -> frozenset[int]:
    """The pids of the writing process's workers running now (none before they start): a
    connection on an inter-process socket is taken only from one of them (api/peercred.py).
    A worker that exited leaves the set before its pid can be reused (it is reaped after)."""
    workers = app.get(WORKERS)
    return frozenset(workers.pids()) if workers is not None else frozenset()


async def stop_workers(app: web.Application) -> None:
    """on_shutdown: the workers stop taking connections as this process does."""
    workers = app.get(WORKERS)
    if workers is not None:
        workers.stop()
