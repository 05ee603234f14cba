"""A worker process of `ckpt serve` (node/supervisor.py starts it: `python -m node.worker`).

It reads its `WorkerSpec` from standard input, dies with the writing process that started
it, holds its share of `workers.lock`, and accepts on the listening sockets it inherited
from that process: reads answered from the data dir's maps, everything else forwarded
(node/forward.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import sys
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import generate_latest

from checkpoint_vault.api.app import create_app
from checkpoint_vault.api.auth import auth_middleware
from checkpoint_vault.api.cluster import cluster_middleware, passed_on
from checkpoint_vault.api.cluster.signed import signed_principal
from checkpoint_vault.api.engine import hold_shared
from checkpoint_vault.api.keys import LIMITER, METRICS, SAVES, SETTINGS, TOKENS, UNHEADED, VAULT
from checkpoint_vault.api.observability import AccessLogger, configure_logging
from checkpoint_vault.api.txn import txn_middleware
from checkpoint_vault.vault import VaultError
from checkpoint_vault.vault.runtime import os_name

from .calls import CallClient
from .forward import ForwardBounds, Forwarder, forward_middleware
from .keys import FORWARDER
from .serve import inherited, tls_context, tune_malloc
from .sinks import ChannelSink
from .supervisor import WorkerSpec, die_with_parent

USES_EVERY = 10.0  # seconds between a worker's hand-overs of its tokens' last uses


class Worker:
    """The role of a worker: it opens the vault to read, answers reads itself, prepares
    one-request saves (`ChannelSink`) and forwards every other change to the process that
    writes (node/forward.py)."""

    reader = True

    def __init__(self, index: int) -> None:
        self.index = index

    def middlewares(self, first: list[Middleware]) -> list[Middleware]:
        """It authenticates (and charges the token's rate) before it forwards or hands over
        anything: the process that writes then holds nothing for a caller without a token.
        It settles a namespace's decided transactions (`txn_middleware`) only for what it
        answers itself: the writing process settles what it is passed, at once, where this
        process could only wait for it to (its resolver's next pass)."""
        return [
            *first,
            auth_middleware(
                TOKENS, LIMITER, passed_on, signed_principal
            ),  # another node's owner charges it
            cluster_middleware(),
            forward_middleware(FORWARDER),  # the writing process settles what it is passed
            txn_middleware(),  # reads here wait for decided transactions (api/txn/)
        ]

    def install(self, app: web.Application) -> None:
        app.cleanup_ctx.append(_writer_context)

    async def peer_metrics(self, app: web.Application) -> list[str]:
        return []  # the process that writes gathers them (node/writer.py)


async def _writer_context(app: web.Application) -> AsyncIterator[None]:
    """A worker's ways to the process that writes: requests it forwards, and saves it
    prepared (node/forward.py, node/calls.py)."""
    settings = app[SETTINGS]
    assert settings.engine_socket is not None  # no workers without them
    assert settings.calls_socket is not None
    assert settings.handoff_socket is not None
    bounds = ForwardBounds(
        settings.forwards_per_token,
        settings.forwards_per_worker,
        settings.body_timeout,
        settings.body_min_rate,
    )
    app[FORWARDER] = Forwarder(str(settings.engine_socket), str(settings.handoff_socket), bounds)
    registry = app[METRICS].registry
    calls = CallClient(
        str(settings.calls_socket),
        asyncio.get_running_loop(),
        lambda: generate_latest(registry).decode(),
    )
    await calls.connect()
    app[SAVES] = ChannelSink(app[VAULT], calls)
    uses = asyncio.get_running_loop().create_task(_hand_uses(app, calls))
    try:
        yield
    finally:
        uses.cancel()
        if taken := app[TOKENS].take_uses():
            with contextlib.suppress(VaultError):  # the writing process may be gone first
                await calls.note_uses(taken)
        await calls.close()
        await app[FORWARDER].close()


async def _hand_uses(app: web.Application, calls: CallClient) -> None:
    """A worker's tokens' last uses go to the writing process, which stores them."""
    while True:
        await asyncio.sleep(USES_EVERY)
        taken = app[TOKENS].take_uses()
        if taken:
            try:
                await calls.note_uses(taken)
            except VaultError:  # the writing process is away: kept for the next round
                app[TOKENS].note_uses(taken)


def _ready(ready: int, go: int) -> Callable[[web.Application], Awaitable[None]]:
    """on_startup, after the vault opened: say so, then wait for the writing process to
    let every worker accept at once (node/supervisor.py); its end of file means it died, and
    PR_SET_PDEATHSIG ends this process."""

    async def startup(app: web.Application) -> None:
        os.write(ready, b"1")
        os.close(ready)
        loop = asyncio.get_running_loop()
        told: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            loop.remove_reader(go)
            told.set_result(None)

        loop.add_reader(go, readable)
        try:
            await told
        finally:
            loop.remove_reader(go)
            os.close(go)

    return startup


def main() -> None:
    spec = pickle.load(sys.stdin.buffer)  # noqa: S301 - written by our parent process
    if not isinstance(spec, WorkerSpec):
        raise SystemExit("node.worker: expected a WorkerSpec on standard input")
    die_with_parent(spec.parent)
    os_name(f"ckpt-worker-{spec.index}")
    tune_malloc()
    settings = spec.settings
    configure_logging(settings.log_format)
    hold_shared(settings)
    app = create_app(settings, instance=spec.instance, role=Worker(spec.index))
    app.on_startup.append(_ready(spec.ready, spec.go))  # after the vault opened (cleanup contexts)
    web.run_app(
        app,
        sock=inherited(spec.listening, settings.spare_descriptors, app[UNHEADED]),
        keepalive_timeout=settings.header_timeout,
        shutdown_timeout=settings.shutdown_timeout,
        ssl_context=tls_context(settings),
        access_log=logging.getLogger("ckpt.access"),
        access_log_class=AccessLogger,
        print=None,
    )


if __name__ == "__main__":
    main()
