"""Handlers reading a request body, tracked so shutdown can abort them, and the bounds on
how slowly a body read on the event loop may arrive.

A leaf module (aiohttp, stdlib, vault and api/errors.py only): api/keys.py names its class
as an AppKey type, and api/forward.py reads bodies with `MinRateBody`.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import StreamReader, web

from checkpoint_vault.vault import InvalidRequest, Unavailable

from .errors import BodyTimeout


class MinRateBody:
    """A request body read on the event loop, answered 408 (`BodyTimeout`) when the client
    sends nothing for `idle` seconds, or when, `idle` seconds after the first read, it has
    sent fewer than `rate` bytes per second since (0: no rate; mod_reqtimeout's MinRate).
    The large bodies a receiver thread takes have the same bound (api/receive.py); small
    ones had only the idle timer, so a byte every 20 s held a connection for ever (and,
    forwarded, one of the writing process's descriptors). Only time spent waiting on the
    client counts towards `idle`; the rate counts all of it, as the receivers' does."""

    def __init__(self, content: StreamReader, idle: float, rate: int) -> None:
        self._content = content
        self._idle, self._rate = idle, rate
        self._start = 0.0  # set by the first read
        self._got = 0

    def _allowed(self) -> float:
        """Seconds the next read may wait, and whether the rate (not idleness) sets it."""
        if not self._rate:
            return self._idle
        left = self._start + self._idle + self._got / self._rate - time.monotonic()
        return max(0.0, min(self._idle, left))

    async def read(self, n: int = -1) -> bytes:
        if not self._start:
            self._start = time.monotonic()
        # A timer that cancels this task (asyncio.timeout needs 3.11; we support 3.10).
        task = asyncio.current_task()
        assert task is not None
        wait = self._allowed()
        fired = False

        def expire() -> None:
            nonlocal fired
            fired = True
            task.cancel()

        timer = asyncio.get_running_loop().call_later(wait, expire)
        try:
            data = await self._content.read(n)
        except asyncio.CancelledError:
            if not fired:
                raise
            if sys.version_info >= (3, 11):
                task.uncancel()  # the cancellation was ours, and it is handled here
            if wait < self._idle:
                raise BodyTimeout(f"the body arrived slower than {self._rate} bytes/s") from None
            raise BodyTimeout(f"no body bytes arrived for {self._idle:g} s") from None
        except ConnectionResetError:
            # The client left: answered (to no one) without aiohttp's traceback, which a
            # crowd of clients dropping their bodies turned into a log line each.
            raise InvalidRequest("the connection ended before the body was whole") from None
        finally:
            timer.cancel()
        self._got += len(data)
        return data


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
