"""The role of the process that writes when workers answer on the port.

It answers nothing on the port itself (node/supervisor.py says why): it takes the saves its
workers prepared (node/calls.py), the requests they forward on the engine socket
(node/forward.py) and the connections they hand over (node/handoff.py), and it starts and
keeps the workers. A service in one process needs none of this (`api.app.Alone`).
"""

from __future__ import annotations

import asyncio
import functools
import socket
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.typedefs import Middleware

from checkpoint_vault.api.audit import audit_middleware
from checkpoint_vault.api.auth import auth_middleware
from checkpoint_vault.api.cluster import cluster_middleware, passed_on
from checkpoint_vault.api.keys import LIMITER, SETTINGS, TOKENS, VAULT
from checkpoint_vault.api.roles import read_only_middleware
from checkpoint_vault.api.settings import Settings
from checkpoint_vault.api.txn import txn_middleware

from .calls import CallServer
from .forward import trusted_forwards
from .handoff import FIRST, Adopted
from .keys import ADOPTED, CALLS
from .peercred import WorkerPeers, worker_listener
from .supervisor import stop_workers, worker_pids, workers_context


class Writer:
    """`listening`: the port's listening sockets, a set for each worker (node/serve.py)."""

    index = 0
    reader = False

    def __init__(self, settings: Settings, listening: list[list[socket.socket]]) -> None:
        assert settings.engine_socket is not None  # no workers without it (Settings.processes)
        self._engine = str(settings.engine_socket)
        self._listening = listening
        self.adopted = Adopted(settings.adopted_per_token, settings.adopted_connections)

    def middlewares(self, first: list[Middleware]) -> list[Middleware]:
        """A worker authenticated (and charged the token's rate) before it forwarded or
        handed over anything: this process authenticates again but charges only what came
        straight to it (`_charged`); it believes the caller's address a worker names only on
        the engine socket, and counts connections handed over against their token."""
        return [
            trusted_forwards(self._engine, worker_pids),
            *first,
            self.adopted.marking(),
            auth_middleware(TOKENS, LIMITER, functools.partial(_charged, self._engine)),
            self.adopted.counting(),
            cluster_middleware(),
            txn_middleware(),
            read_only_middleware(),
            audit_middleware(),
        ]

    def install(self, app: web.Application) -> None:
        app[ADOPTED] = self.adopted
        app.cleanup_ctx.append(_calls_context)  # closed after the workers stopped
        app.cleanup_ctx.append(workers_context(self._listening))
        app.on_shutdown.append(stop_workers)

    async def peer_metrics(self, app: web.Application) -> list[str]:
        return await app[CALLS].worker_metrics()


def _charged(engine_socket: str, request: web.Request) -> bool:
    """Whether a worker charged this request's token already: it forwarded it (it came on
    the engine socket) or handed its connection over (its first request); or another
    node's owner will (this process passes it on there)."""
    transport = request.transport
    on_engine = transport is not None and transport.get_extra_info("sockname") == engine_socket
    return on_engine or bool(request.get(FIRST, False)) or passed_on(request)


async def _calls_context(app: web.Application) -> AsyncIterator[None]:
    """This process's end of node/calls.py: its workers' prepared saves, their tokens'
    uses, and its questions to them. Closed after they stopped."""
    path = app[SETTINGS].calls_socket
    assert path is not None  # no workers without it (Settings.processes)
    app[CALLS] = CallServer(app[VAULT], app[TOKENS].note_uses)
    peers = WorkerPeers(path.name, lambda: worker_pids(app))  # its workers only: 0600
    listener = worker_listener(str(path), peers)
    server = await asyncio.get_running_loop().create_unix_server(
        app[CALLS].connection, sock=listener
    )
    try:
        yield
    finally:
        server.close()
        await server.wait_closed()
