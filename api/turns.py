"""`Turns`: each token waits in its own queue for the worker threads it may hold.

The worker pool (`vault-io`, `worker_threads`) runs every engine call of every tenant, first
come, first served: one token with many calls in flight (commits reading back, listings of
large namespaces) filled it and every other tenant's request waited behind. Here a token
holds at most its share of the pool (`workers_per_token`) at once; a call past that waits
in the token's own queue, on the event loop, holding no thread, and takes the turn its own
earlier call gives back. Other tokens never wait behind it. Counted on the event loop only
(no lock); an entry is dropped when its token holds and awaits nothing.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class Turns:
    def __init__(self, share: int) -> None:
        self._share = share  # 0: no bound
        self._held: dict[str, int] = {}
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}

    @asynccontextmanager
    async def turn(self, name: str) -> AsyncIterator[None]:
        """Hold one of `name`'s turns for the body, waiting in its queue when it holds all."""
        if not self._share:
            yield
            return
        held = self._held.get(name, 0)
        if held < self._share:
            self._held[name] = held + 1
        else:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(name, deque()).append(waiter)
            try:
                await waiter  # handed a turn by `_give_back`
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._give_back(name)  # handed over as we were cancelled: pass it on
                else:
                    self._drop_waiter(name, waiter)
                raise
        try:
            yield
        finally:
            self._give_back(name)

    def held(self, name: str) -> int:
        return self._held.get(name, 0)

    def waiting(self, name: str) -> int:
        return len(self._waiting.get(name, ()))

    def _give_back(self, name: str) -> None:
        queue = self._waiting.get(name)
        while queue:
            waiter = queue.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the turn goes to the next in line: held unchanged
                return
        self._waiting.pop(name, None)
        held = self._held.get(name, 0) - 1
        if held > 0:
            self._held[name] = held
        else:
            self._held.pop(name, None)

    def _drop_waiter(self, name: str, waiter: asyncio.Future[None]) -> None:
        queue = self._waiting.get(name)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            if not queue:
                self._waiting.pop(name, None)
