"""Saves that run behind the caller's back: a bounded number in flight, none ever lost.

A background save has two parts. The *snapshot* runs in the caller's thread, because only
a copy taken before the call returns is consistent with what the caller asked to save;
that copy is the only time the caller is blocked. The *upload* then runs on the client's
event loop while the caller goes on (training, say).

At most `limit` saves are in flight: each holds a snapshot in memory, so a caller saving
faster than the vault accepts waits for a slot before its next snapshot (back-pressure)
instead of piling up copies. A failed save raises from its handle's `result()`; one whose
handle nobody looked at is logged when it fails and raised again by `wait()` (which
the clients' `flush()` and `close()` call), so a failure is never silently dropped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections import deque
from collections.abc import Callable, Coroutine, Generator, Mapping
from typing import Any

from .chunking import FileSpec, collect_sources
from .errors import ClientError
from .loopthread import detach_from_caller, in_caller
from .models import Checkpoint

log = logging.getLogger(__name__)

Prepare = Callable[[], Coroutine[Any, Any, Checkpoint]]
"""Takes the snapshot (in the caller's thread) and returns the coroutine that uploads it."""


class BackgroundSaveFailed(ClientError):
    """Background saves failed and nobody asked their handles; `errors` has each one."""

    code = "background_save_failed"

    def __init__(self, errors: list[BaseException]) -> None:
        first = errors[0]
        super().__init__(
            f"{len(errors)} background save(s) failed; the first: {type(first).__name__}: {first}"
        )
        self.errors = errors


class SaveHandle:
    """One background save. `result()` waits and answers its checkpoint or raises its
    error; in async code, `await handle` does the same without blocking the loop."""

    def __init__(self, owner: BackgroundSaves, future: concurrent.futures.Future[Checkpoint]):
        self._owner = owner
        self._future = future
        self._task: concurrent.futures.Future[None] | None = None  # keeps the upload alive

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> Checkpoint:
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            if self._future.done():  # the save itself timed out: that is its error
                self._owner._observed(self)
            raise
        except BaseException:
            self._owner._observed(self)
            raise

    def exception(self, timeout: float | None = None) -> BaseException | None:
        error = self._future.exception(timeout)
        self._owner._observed(self)
        return error

    def __await__(self) -> Generator[Any, None, Checkpoint]:
        return self._wait().__await__()

    async def _wait(self) -> Checkpoint:
        try:
            return await asyncio.wrap_future(self._future)
        except BaseException:
            if self._future.done():
                self._owner._observed(self)
            raise


class BackgroundSaves:
    """The background saves of one client, at most `limit` (>= 1) in flight at once."""

    def __init__(self, limit: int = 1) -> None:
        if limit < 1:
            raise ValueError(f"background save limit must be at least 1, not {limit}")
        self.limit = limit
        self._lock = threading.Lock()
        self._granted = 0  # slots taken: saves snapshotting or uploading
        self._waiters: deque[concurrent.futures.Future[None]] = deque()
        self._running: set[SaveHandle] = set()
        self._failed: dict[SaveHandle, BaseException] = {}  # failed, not yet looked at

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._granted

    async def submit(self, prepare: Prepare, *, timeout: float | None = None) -> SaveHandle:
        """On the upload loop: wait for a slot (TimeoutError after `timeout` seconds), run
        `prepare` in the blocked caller's thread (a `VaultClient` call) or on a worker
        thread (async code), then start the upload; return its handle at once after."""
        slot = self._slot()
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(slot)), timeout)
        except asyncio.TimeoutError:
            if slot.cancel():  # else it was granted just as time ran out: use it
                raise TimeoutError(f"no background save slot within {timeout} s") from None
        except asyncio.CancelledError:
            if not slot.cancel():  # granted as we were cancelled: hand it on
                self._release()
            raise
        try:
            upload = await in_caller(prepare)
        except BaseException:
            self._release()
            raise
        return self._launch(upload, asyncio.get_running_loop())

    async def wait(self) -> None:
        """Wait for every save in flight; raise `BackgroundSaveFailed` for failures whose
        handles nobody asked (they count as asked after this)."""
        with self._lock:
            futures = [h._future for h in self._running]
        await asyncio.gather(*(asyncio.wrap_future(f) for f in futures), return_exceptions=True)
        self._raise_unobserved()

    # -- internals --------------------------------------------------------------------
    def _slot(self) -> concurrent.futures.Future[None]:
        """A future that completes once this caller holds a slot (first come, first
        served); cancelling it while still pending gives up the place in the queue."""
        slot: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._lock:
            if self._granted < self.limit and not self._waiters:
                self._granted += 1
                slot.set_running_or_notify_cancel()
                slot.set_result(None)
            else:
                self._waiters.append(slot)
        return slot

    def _release(self) -> None:
        with self._lock:
            while self._waiters:
                waiter = self._waiters.popleft()
                if waiter.set_running_or_notify_cancel():  # False: its caller gave up
                    waiter.set_result(None)  # the slot passes straight on
                    return
            self._granted -= 1

    def _launch(
        self, upload: Coroutine[Any, Any, Checkpoint], loop: asyncio.AbstractEventLoop
    ) -> SaveHandle:
        """Run `upload` on `loop` under the slot its caller holds. The slot is freed and a
        failure recorded before the handle completes, so whoever waits on the handle sees
        both done."""
        future: concurrent.futures.Future[Checkpoint] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
        handle = SaveHandle(self, future)
        with self._lock:
            self._running.add(handle)

        async def run() -> None:
            detach_from_caller()
            try:
                result = await upload
            except BaseException as e:  # handed to the handle, never dropped
                self._finished(handle, e)
                future.set_exception(e)
            else:
                self._finished(handle, None)
                future.set_result(result)

        handle._task = asyncio.run_coroutine_threadsafe(run(), loop)
        return handle

    def _finished(self, handle: SaveHandle, error: BaseException | None) -> None:
        with self._lock:
            self._running.discard(handle)
            if error is not None:
                self._failed[handle] = error
        if error is not None:
            log.error(
                "background save failed (its handle's result() raises it): %s: %s",
                type(error).__name__,
                error,
            )
        self._release()

    def _observed(self, handle: SaveHandle) -> None:
        with self._lock:
            self._failed.pop(handle, None)

    def _raise_unobserved(self) -> None:
        with self._lock:
            errors = list(self._failed.values())
            self._failed.clear()
        if errors:
            raise BackgroundSaveFailed(errors)


def snapshot_files(files: FileSpec | Mapping[str, FileSpec]) -> dict[str, bytes]:
    """Everything `save` would read, read now: the consistent copy a background save
    uploads (bytes stay shared, being immutable; paths and file objects are read)."""
    out: dict[str, bytes] = {}
    for source in collect_sources(files):
        if source.in_memory is not None:
            out[source.name] = source.in_memory
            continue
        reader = source.open()
        try:
            out[source.name] = reader.read()
        finally:
            reader.close()
    return out
