"""The process an app serves in, as the HTTP core sees it.

A service runs as one process or as several on one data dir (node/: the process that
writes and its workers). The HTTP core never asks which one it is: each role's app factory
hands `create_app` a `Role` that says how the process opens the vault, which middlewares
guard it and what else it runs beside the core; routes take what they need from the app's
keys (api/keys.py: a save sink in `SAVES`, the role in `ROLE` for health and metrics);
`Alone` (api/app.py) is the role of a service in one process.
"""

from __future__ import annotations

from typing import Protocol

from aiohttp import web
from aiohttp.typedefs import Middleware


class Role(Protocol):
    """What differs between the processes of one service."""

    @property
    def index(self) -> int:
        """Which process health names: 0 writes, 1.. are its workers."""

    @property
    def reader(self) -> bool:
        """Opens the vault to read only: its changes go to the process that writes."""

    def middlewares(self, first: list[Middleware]) -> list[Middleware]:
        """The app's middlewares, given those every process runs first (ids, metrics,
        errors)."""

    def install(self, app: web.Application) -> None:
        """Add what the role runs beside the core (cleanup contexts after the vault's,
        shutdown hooks, its own keys)."""

    async def peer_metrics(self, app: web.Application) -> list[str]:
        """The other processes' metrics texts, for `/metrics` of the whole service."""
