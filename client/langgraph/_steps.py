"""A saver's writes and reads as steps, written once and run by either face.

A put or a put_writes is a little logic around one or two saves: which files to send,
what to fall back to, what to remember after; a get_tuple is a listing and, unless this
process has the files already, downloads. `AsyncVaultSaver` runs it on its event loop;
`VaultSaver` runs it on the caller's thread, which it blocks anyway, so a small save goes
(or a listing) out from there without a hop to the client's loop thread and back
(client/_sync_base.py).
So the logic is a generator that yields what it needs done and gets each outcome back
(sans-IO): `Save` (a checkpoint saved, its record sent back, or its error thrown in),
`List` (a page of a thread's records as the server's JSON: a read's one request),
`Offload` (blocking work kept off an event loop: serializing values), `Run` (a coroutine
that belongs on the loop: downloads side by side) and `Wait` (a put this one must commit
after). `run` and `run_here` are the two drivers; nothing else differs.
Inside a saver's atomic block a `Save` is held in its `Staging` instead (answered None),
and the block's end commits every held save at once (the saver's `atomic`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Generator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from ..aio import AsyncVaultClient
from ..chunking import collect_sources
from ..options import SaveOptions

if TYPE_CHECKING:
    from ..sync import VaultClient

T = TypeVar("T")
Answer = Literal["record", "json", "nothing"]


@dataclass(frozen=True)
class Save:
    """`client.save(namespace, files, **options)`, its options built once; answers the
    checkpoint. `answer`: what the steps need of it, so a driver may skip the rest:
    "record" (a `Checkpoint`), "json" (the answer's JSON, or a `Checkpoint`) or "nothing"
    (None, or a `Checkpoint`)."""

    namespace: str
    files: dict[str, bytes]
    options: SaveOptions
    answer: Answer = "record"
    key: tuple[str, str, str] | None = None  # the checkpoint it stores (its Put.key)


@dataclass(frozen=True)
class Offload:
    """`fn()`, on a worker thread when the driver is an event loop; answers its result."""

    fn: Callable[[], Any]


@dataclass(frozen=True)
class List:
    """`client.list(namespace, limit=..., before=..., tag=...)`: a page of records, newest
    first, as the server's JSON (its NotFound thrown in): the steps make `Checkpoint`s
    only of the records they use."""

    namespace: str
    limit: int
    before: str | None
    tag: str | None


@dataclass(frozen=True)
class Run:
    """`await make()` on the client's loop, whichever the driver (several downloads at
    once, which a blocked thread would make one after the other)."""

    make: Callable[[], Coroutine[Any, Any, Any]]


@dataclass(frozen=True)
class Wait:
    """Until `done` is set (whatever the put it stands for ended with); answers None."""

    done: Future[None]


Step = Save | List | Offload | Run | Wait
Steps = Generator[Step, Any, T]


class Staging:
    """Saves held back by an atomic block, in the order they were made (several threads
    of a sync program add to it)."""

    def __init__(self) -> None:
        self._saves: list[Save] = []
        self._lock = threading.Lock()

    def add(self, save: Save) -> None:
        with self._lock:
            self._saves.append(save)

    def saves(self) -> list[Save]:
        with self._lock:
            return list(self._saves)


async def run(steps: Steps[T], client: AsyncVaultClient, staging: Staging | None = None) -> T:
    """Run `steps` on this event loop (saves held in `staging` when given)."""
    with _Stepper(steps) as stepper:
        while (step := stepper.next()) is not None:
            try:
                stepper.answer(await _do(step, client, staging))
            except Exception as e:  # noqa: BLE001 - the steps decide: handled or raised there
                stepper.fail(e)
        return stepper.result


def run_here(steps: Steps[T], client: VaultClient, staging: Staging | None = None) -> T:
    """Run `steps` on this thread, blocking it (a small save goes out from here). What
    `_Stepper` does, written out: a put is two steps, and its client CPU is counted."""
    try:
        step = steps.send(None)
        while True:
            try:
                answer = _do_here(step, client, staging)
            except Exception as e:  # noqa: BLE001 - the steps decide: handled or raised there
                step = steps.throw(e)
            else:
                step = steps.send(answer)
    except StopIteration as done:
        result: T = done.value
        return result
    finally:
        steps.close()


class _Stepper(Generic[T]):
    """Hands each outcome to the steps and takes the next step; what both drivers share.
    Leaving it closes the steps, so an abandoned put still ends (its `finally` runs)."""

    def __init__(self, steps: Steps[T]) -> None:
        self._steps = steps
        self._answer: Any = None
        self._error: Exception | None = None
        self.result: T

    def next(self) -> Step | None:
        """The next step, or None once the steps returned (their value in `result`)."""
        answer, error = self._answer, self._error
        self._answer, self._error = None, None
        try:
            return self._steps.throw(error) if error is not None else self._steps.send(answer)
        except StopIteration as done:
            self.result = done.value
            return None

    def answer(self, value: Any) -> None:
        self._answer = value

    def fail(self, error: Exception) -> None:
        self._error = error

    def __enter__(self) -> _Stepper[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self._steps.close()


async def _do(step: Step, client: AsyncVaultClient, staging: Staging | None) -> Any:
    if isinstance(step, Save) and staging is not None:
        staging.add(step)
        return None
    if isinstance(step, Save):
        return await client._save_sources(step.namespace, collect_sources(step.files), step.options)
    if isinstance(step, List):
        return await client._list_wire(step.namespace, step.limit, step.before, step.tag)
    if isinstance(step, Offload):
        return await asyncio.to_thread(step.fn)
    if isinstance(step, Run):
        return await step.make()
    await asyncio.shield(asyncio.wrap_future(step.done))
    return None


def _do_here(step: Step, client: VaultClient, staging: Staging | None) -> Any:
    if isinstance(step, Save) and staging is not None:
        staging.add(step)
        return None
    if isinstance(step, Save):
        if step.answer == "record":
            return client._save_bytes_here(step.namespace, step.files, step.options)
        parse = step.answer == "json"
        return client._post_bytes_here(step.namespace, step.files, step.options, parse=parse)
    if isinstance(step, List):
        return client._list_wire_here(step.namespace, step.limit, step.before, step.tag)
    if isinstance(step, Offload):
        return step.fn()
    if isinstance(step, Run):
        return client._run(step.make())
    step.done.result()
    return None
