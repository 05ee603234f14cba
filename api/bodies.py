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


class BodyReaders:
    """Handlers currently reading a request body.

    aiohttp stops reading sockets once shutdown begins, so such a handler could only wait out
    shutdown_timeout. On SIGTERM they are cancelled at once (nothing they stored is visible
    before a commit) and later ones are refused with 503, while every other request is left
    to finish.
    """

    def __init__(self) -> None:
        self.stopping = False
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
