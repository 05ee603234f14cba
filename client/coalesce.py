"""Small saves of one client, sent together while they wait.

An agent platform runs many agents on one `AsyncVaultClient`, each saving its state every
step. Alone, every such save is an HTTP exchange whose fixed cost (the request, its
authentication, the server's thread hops, the answer) is most of what the server spends on
it. `Coalescer` keeps at most `in_flight` one-request saves travelling; saves made while
that many are under way wait, and the next free slot takes all that waited (up to
`MAX_SAVES` bundles, `MAX_BYTES`) in one `POST /v1/saves` (api/routes/saves.py), split
evenly over the free slots. One agent saving alone never waits: with nothing under way a
save goes at once, on its own route; while others travel, saves wait until `MIN_BATCH` of
them can go together or nothing is under way.

Nothing about a save changes by travelling with others: each keeps its namespace, options,
idempotency key and its own answer. An entry the server answers 429 or 503 is sent again
alone, with the client's retry rule; a server without the route (older) gets every save
alone from then on, as does a batch the server refuses as a whole (each save then meets
its own answer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from checkpoint_vault.protocol import MAX_SAVES

from .errors import ClientError, NotFound, TransportError, error_from
from .transport import retryable

# Saves a request carries while another is under way: fewer wait for more to join them or
# for the others to come back. With 16 agents on 2 cores (docs/SCALING.md), a save in a
# request of ~16 cost the server 1.3-1.9 ms of CPU and the client 0.55-0.7, alone 1.9-2.6
# and 0.9-1.1; requests of 1-2 saved little of it.
MIN_BATCH = 4
MAX_BYTES = 8 << 20  # bundle bytes in one request: well under the server's max_batch_body

SendOne = Callable[[str, bytes], Awaitable[Any]]  # (namespace, bundle) to its own route
SendMany = Callable[[list[bytes]], Awaitable[Any]]  # bundles to /v1/saves: {"results": [...]}
_Waiting = tuple[str, bytes, "asyncio.Future[Any]"]


class Coalescer:
    def __init__(self, send_one: SendOne, send_many: SendMany, in_flight: int) -> None:
        """`in_flight`: requests of one-request saves under way at once; 0 sends every save
        on its own request at once (no coalescing)."""
        self._one = send_one
        self._many = send_many
        self._limit = in_flight
        self._busy = 0
        self._waiting: list[_Waiting] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0  # requests that carried several saves (for tests and figures)
        self._flush_due = False

    async def save(self, namespace: str, bundle: bytes) -> Any:
        """The record (JSON) of the checkpoint `bundle` made in `namespace` (which its
        header names too), as the save's own route answers it."""
        if self._limit <= 0:
            return await self._one(namespace, bundle)
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append((namespace, bundle, answer))
        if not self._flush_due:
            # At the end of this turn of the loop: the saves its other callbacks make (the
            # agents one answer woke) join this one.
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._pump)
        try:
            return await asyncio.shield(answer)
        except asyncio.CancelledError:
            # Not yet sent: it never will be. Sent: it may still commit, as a single
            # save cancelled mid-request may; its answer is dropped.
            self._waiting = [w for w in self._waiting if w[2] is not answer]
            answer.cancel()
            raise

    def _pump(self) -> None:
        """Send what waits over the free slots, split evenly: requests side by side keep
        the server's processes and this client working at once."""
        self._flush_due = False
        while self._waiting and self._busy < self._limit:
            if self._busy and len(self._waiting) < MIN_BATCH:
                return  # a request under way will make room; more saves join these meanwhile
            share = max(MIN_BATCH, -(-len(self._waiting) // (self._limit - self._busy)))
            batch: list[_Waiting] = []
            size = 0
            while self._waiting and len(batch) < min(share, MAX_SAVES):
                bundle = self._waiting[0][1]
                if batch and size + len(bundle) > MAX_BYTES:
                    break
                batch.append(self._waiting.pop(0))
                size += len(bundle)
            self._busy += 1
            task = asyncio.ensure_future(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[_Waiting]) -> None:
        try:
            if len(batch) == 1:
                await self._alone(*batch[0])
            else:
                await self._together(batch)
        finally:
            self._busy -= 1
            self._pump()

    async def _together(self, batch: list[_Waiting]) -> None:
        try:
            answer = await self._many([bundle for _, bundle, _ in batch])
            results = answer["results"]
            if len(results) != len(batch):
                raise ValueError(f"{len(results)} answers to {len(batch)} saves")
        except TransportError as e:  # the network, after the retries: every save failed
            for _, _, future in batch:
                _settle(future, error=e)
            return
        except (ClientError, KeyError, TypeError, ValueError) as e:
            if isinstance(e, NotFound):
                self._limit = 0  # a server without /v1/saves: one request each from now
            await asyncio.gather(*(self._alone(*waiting) for waiting in batch))
            return
        self.batches += 1
        again = []
        for (namespace, bundle, future), entry in zip(batch, results, strict=True):
            status = entry.get("status", 500)
            if 200 <= status < 300:
                _settle(future, value=entry.get("checkpoint"))
                continue
            error = error_from(status, {"error": entry.get("error")})
            error.retry_after = entry.get("retry_after")
            if retryable(error):
                again.append(self._alone(namespace, bundle, future))
            else:
                _settle(future, error=error)
        await asyncio.gather(*again)

    async def _alone(self, namespace: str, bundle: bytes, future: asyncio.Future[Any]) -> None:
        try:
            value = await self._one(namespace, bundle)
        except Exception as e:  # noqa: BLE001 - the caller's to raise
            _settle(future, error=e)
        else:
            _settle(future, value=value)


def _settle(
    future: asyncio.Future[Any], value: Any = None, error: BaseException | None = None
) -> None:
    if future.done():  # its caller was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)
