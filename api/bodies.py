"""Handlers reading a request body, tracked so shutdown can abort them.

A leaf module (aiohttp, stdlib and vault only): api/keys.py names its class as an AppKey type.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web

from vault import Unavailable


class Shares:
    """Threads of one pool (receivers, hand-overs) held per token name, counted on the event
    loop (no lock: taken and given back only there).

    A pool's queue is first come, first served: one token holding every thread of it
    (dripped bodies, files that read slowly) made every other tenant's body wait behind.
    Past its share a token is refused (the caller answers 429 with Retry-After) while the
    rest of the pool stays free for the others."""

    def __init__(self) -> None:
        self._held: dict[str, int] = {}

    def take(self, name: str, share: int) -> bool:
        """One more thread for `name`, if it holds fewer than `share` (0: no bound)."""
        held = self._held.get(name, 0)
        if share and held >= share:
            return False
        self._held[name] = held + 1
        return True

    def give_back(self, name: str) -> None:
        held = self._held.get(name, 0) - 1
        if held > 0:
            self._held[name] = held
        else:
            self._held.pop(name, None)

    def held(self, name: str) -> int:
        return self._held.get(name, 0)


class BodyReaders:
    """Handlers currently reading a request body.

    aiohttp stops reading sockets once shutdown begins, so such a handler could only wait out
    shutdown_timeout. On SIGTERM they are cancelled at once (nothing they stored is visible
    before a commit) and later ones are refused with 503, while every other request is left
    to finish.
    """

    def __init__(self) -> None:
        self.stopping = False
        self.receivers = Shares()  # vault-receive threads per token (`receivers_per_token`)
        self.handovers = Shares()  # vault-handover threads per token (`handovers_per_token`)
        self._tasks: set[asyncio.Task[Any]] = set()

    @contextmanager
    def track(self) -> Iterator[None]:
        if self.stopping:
            raise Unavailable("the server is shutting down; retry against its successor")
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            yield
        finally:
            self._tasks.discard(task)

    async def abort_all(self, app: web.Application) -> None:
        self.stopping = True
        for task in list(self._tasks):
            task.cancel()
