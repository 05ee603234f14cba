"""An executor whose threads are daemons, for the client's requests and file work.

`concurrent.futures.ThreadPoolExecutor` refuses new work once the interpreter starts to
exit (its exit hook runs before `atexit` handlers), but a client the program never closed
finishes its background saves from an `atexit` handler (client/_sync_base.py), and those
need threads then. Daemon threads also never hold up the exit themselves: every call that
matters is awaited by a caller that is still running.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")
_Work = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class DaemonPool(Executor):
    """Up to `size` daemon threads, started when work finds none idle."""

    def __init__(self, size: int, name: str) -> None:
        self._size = max(1, size)
        self._name = name
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()
        self._shut = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new work after shutdown")
            self._work.put((future, fn, args, kwargs))
            if self._idle:
                self._idle -= 1  # that thread takes this work
            elif len(self._threads) < self._size:
                thread = threading.Thread(
                    target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Let queued work finish, then stop the threads (waiting for them if `wait`)."""
        with self._lock:
            self._shut = True
            threads = list(self._threads)
        for _ in threads:
            self._work.put(None)
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _run(self) -> None:
        while (work := self._work.get()) is not None:
            future, fn, args, kwargs = work
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as e:  # noqa: BLE001 - handed to whoever awaits it
                    future.set_exception(e)
                else:
                    future.set_result(result)
                del future, fn, args, kwargs, work
            with self._lock:
                self._idle += 1
