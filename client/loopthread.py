"""An event loop on a daemon thread of its own, for the blocking face of async code
(`VaultClient`, and through it the LangGraph `VaultSaver`), and the way back to the
blocked caller.

`LoopThread.run(coro)` runs a coroutine on the loop and blocks the calling thread until it
is done. While it blocks, the caller's thread is lent back: a coroutine of that call may
`await in_caller(fn)` to run `fn` in the caller's thread (a background save takes its
snapshot there, where the caller's CUDA stream and device are current). Without a blocked
caller, as in plain async code, `in_caller` runs `fn` on a worker thread.

Fork: the owner registers itself with client/forksafe.py (which keeps the child's copy of
the owner, and so of everything it holds, alive); in a child `run` refuses and `stop`
does nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import queue
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .errors import ClientError

T = TypeVar("T")
_Job = Callable[[], None]
_caller: contextvars.ContextVar[queue.SimpleQueue[_Job | None] | None] = contextvars.ContextVar(
    "ckpt_blocked_caller", default=None
)


async def in_caller(fn: Callable[[], T]) -> T:
    """`fn()` in the thread blocked in `LoopThread.run` for this call, else on a worker
    thread; either way the loop goes on meanwhile."""
    jobs = _caller.get()
    if jobs is None:
        return await asyncio.to_thread(fn)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def job() -> None:
        try:
            result = fn()
        except BaseException as e:  # handed to the awaiting coroutine
            loop.call_soon_threadsafe(_settle, done, None, e)
        else:
            loop.call_soon_threadsafe(_settle, done, result, None)

    jobs.put(job)
    return await done


def detach_from_caller() -> None:
    """For a task that outlives the call that started it (a background upload): nobody
    will be blocked for it, so `in_caller` uses a worker thread."""
    _caller.set(None)


def _settle(done: asyncio.Future[T], result: T | None, error: BaseException | None) -> None:
    if done.cancelled():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)  # type: ignore[arg-type]  # T when error is None


class LoopThread:
    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._pid = os.getpid()  # its owner makes itself inert in children (forksafe.py)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def check_owner(self) -> None:
        """Refuse in a forked child: the copy shares the parent's sockets."""
        if os.getpid() != self._pid:
            raise ClientError("this client belongs to the parent process: make one after fork")

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the loop; block until done, lending this thread to `in_caller`."""
        try:
            self.check_owner()
        except ClientError:
            coro.close()
            raise
        jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()

        async def call() -> T:
            _caller.set(jobs)
            return await coro

        future = asyncio.run_coroutine_threadsafe(call(), self._loop)
        future.add_done_callback(lambda _: jobs.put(None))
        while (job := jobs.get()) is not None:
            job()
        return future.result()

    def stop(self, last: Coroutine[Any, Any, None] | None = None) -> None:
        """Run `last` (a close), then stop the loop and its thread; `last`'s error is
        raised once they are stopped. Nothing in a forked child's copy, or once stopped."""
        if os.getpid() != self._pid or not self._loop.is_running():
            if last is not None:
                last.close()
            return
        try:
            if last is not None:
                self.run(last)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def stop_later(self, last: Coroutine[Any, Any, None]) -> None:
        """`stop`, from wherever a finalizer runs: on the loop's own thread it cannot
        wait for the loop, and on another event loop's thread it should not, so it stops
        from a helper thread then."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self.stop(last)
            return
        threading.Thread(target=self.stop, args=(last,), name="ckpt-close", daemon=True).start()
