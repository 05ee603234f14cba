"""The application factory: one `create_app(settings)` for the entry point, tests and tools.

Builds the app state (vault, worker pool, token cache; the AppKeys themselves are in
api/keys.py) in one cleanup context, so SIGTERM drains in-flight requests, finishes queued
writes and closes LMDB cleanly. Only entry points (`api/__init__.py`, `api/serve.py`) import
this module; everything else imports api/keys.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware
from checkpoint_vault.node.calls import CHANNEL_BUFFER, CallClient, CallServer
from checkpoint_vault.node.forward import (
    ForwardBounds,
    Forwarder,
    forward_middleware,
    trusted_forwards,
)
from checkpoint_vault.node.handoff import FIRST, Adopted
from checkpoint_vault.node.peercred import WorkerPeers, worker_listener
from checkpoint_vault.node.sinks import ChannelSink, LocalSink
from checkpoint_vault.node.supervisor import no_readers, stop_workers, worker_pids, workers_context
from prometheus_client import generate_latest

from checkpoint_vault.protocol import ADMIN_TOKEN_FILE
from checkpoint_vault.vault import Clock, SystemClock, Vault, VaultError
from checkpoint_vault.vault.ownership import open_private, prepare_data_dir
from checkpoint_vault.vault.runtime import PoolSizes, Runtime

from .audit import audit_middleware
from .auth import TokenCache, auth_middleware
from .cluster import cluster_context, cluster_middleware
from .engine import open_vault
from .errors import error_middleware
from .heads import Unheaded, headed_middleware
from .jobs import jobs_context, stop_jobs
from .keys import (
    ADOPTED,
    BODY_READERS,
    CALLS,
    CLOCK,
    FORWARDER,
    INSTANCE,
    JOBS,
    LIMITER,
    LISTENING,
    METRICS,
    RUNTIME,
    SAVES,
    SETTINGS,
    TOKENS,
    TURNS,
    UNHEADED,
    VAULT,
    WORKER,
)
from .observability import (
    JobLog,
    Metrics,
    RequestIds,
    add_request_id_header,
    metrics_middleware,
    request_id_middleware,
)
from .ratelimit import LIMITS_FILE, RateLimiter
from .roles import follow_tokens, read_only_middleware
from .routes import setup_routes
from .scheduler import maintenance_context
from .settings import Settings
from .transfer.bodies import BodyReaders
from .transfer.promotion import promotion_context
from .transfer.receive import close_taken
from .turns import Turns

log = logging.getLogger("ckpt.api")
USES_EVERY = 10.0  # seconds between a worker's hand-overs of its tokens' last uses


def _bootstrap_admin(vault: Vault, data_dir: Path) -> None:
    """First start with no tokens: create an admin token and write it, mode 0600."""
    if vault.tokens.all():
        return
    _, secret = vault.tokens.create("admin", ["admin"])
    path = data_dir / ADMIN_TOKEN_FILE
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)  # refuses one not ours
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    log.warning("created an admin token; it is in %s (mode 0600)", path)


def _open(settings: Settings, clock: Clock, runtime: Runtime, reader: bool) -> Vault:
    """The writing process opens the vault once no worker of an earlier one still reads
    it (api/workers.py); a worker opens it to read."""
    if reader:
        return open_vault(settings, clock, runtime, reader=True)
    with no_readers(settings):
        return open_vault(settings, clock, runtime)


async def _vault_context(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    reader = app[WORKER] > 0
    if not reader:
        prepare_data_dir(settings.data_dir)  # ours alone (vault/ownership.py), 0700 / 0600
    # Every process's buckets in one file: a token's rate is the service's (api/ratelimit.py).
    app[LIMITER] = RateLimiter(
        settings.requests_per_second,
        settings.request_burst,
        app[CLOCK],
        settings.data_dir / LIMITS_FILE,
        fresh=not reader,
    )
    runtime = Runtime(PoolSizes(io=settings.worker_threads))
    loop = asyncio.get_running_loop()
    try:
        vault = await loop.run_in_executor(
            runtime.io, functools.partial(_open, settings, app[CLOCK], runtime, reader)
        )
    except BaseException:
        runtime.close()
        app[LIMITER].close()
        raise
    app[RUNTIME] = runtime
    app[VAULT] = vault
    if not reader:  # a worker's saves go to the writing process (_writer_context)
        app[SAVES] = LocalSink(vault)
    if vault.roles.writable:  # a standby's tokens are the primary's (replicated)
        _bootstrap_admin(vault, settings.data_dir)
    app[TOKENS] = TokenCache(vault.tokens.all(), app[CLOCK])
    if reader:  # tokens change in the writing process
        app[TOKENS].follow(vault.tokens.changes, vault.tokens.all)
    follow_tokens(app, vault)
    try:
        yield
    finally:
        # On a thread of its own, not the loop: a download's pin is let go by a callback
        # on the loop, and closing the environments waits for every pin.
        uses = app[TOKENS].take_uses()
        closing = runtime.close_in_thread(functools.partial(_close, vault, uses))
        try:
            await _through_cancellation(asyncio.wrap_future(closing))
        finally:
            app[LIMITER].close()


async def _through_cancellation(work: asyncio.Future[None]) -> None:
    """Wait for `work` even if this task is cancelled meanwhile (a second SIGTERM cancels
    the task closing the vault; whoever cancels it then waits for it to end), and raise
    the cancellation once it is done: the vault is closed before the process exits."""
    cancelled = False
    while not work.done():
        try:
            await asyncio.shield(work)
        except asyncio.CancelledError:
            if work.done() and not work.cancelled():
                break
            cancelled = True
    work.result()
    if cancelled:
        raise asyncio.CancelledError


def _close(vault: Vault, uses: dict[str, float]) -> None:
    """The engine's part of the runtime's shutdown order (vault/runtime.py): by now the
    request pools have finished (senders within STALL_SECONDS of a stalled client; receivers
    woken and hand-overs told to stop when shutdown aborted the handlers)."""
    vault.tokens.record_use(uses)
    vault.close()


async def _writer_context(app: web.Application) -> AsyncIterator[None]:
    """A worker's ways to the process that writes: requests it forwards, and saves it
    prepared (api/forward.py, api/calls.py)."""
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


async def _calls_context(app: web.Application) -> AsyncIterator[None]:
    """The writing process's end of api/calls.py: its workers' prepared saves, their
    tokens' uses, and its questions to them. Closed after they stopped."""
    path = app[SETTINGS].calls_socket
    assert path is not None  # no workers without it (Settings.processes)
    app[CALLS] = CallServer(app[VAULT], app[TOKENS].note_uses)
    peers = WorkerPeers(path.name, lambda: worker_pids(app))  # its workers only: 0600
    listener = worker_listener(str(path), peers)
    server = await asyncio.start_unix_server(app[CALLS].handle, sock=listener, limit=CHANNEL_BUFFER)
    try:
        yield
    finally:
        server.close()
        await server.wait_closed()


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


def _middlewares(settings: Settings, worker: int, adopted: Adopted | None) -> list[Middleware]:
    """A worker authenticates (and charges the token's rate) before it forwards or hands
    over anything: the writing process then holds nothing for a caller without a token.
    The writing process authenticates again but charges only what came straight to it
    (`_charged`); it believes the caller's address a worker names only on the engine
    socket, and counts connections handed over against their token (api/handoff.py)."""
    first = [
        headed_middleware(UNHEADED),
        request_id_middleware(RequestIds()),
        metrics_middleware(METRICS),
        error_middleware,
    ]
    if worker:
        return [
            *first,
            auth_middleware(TOKENS, LIMITER),
            cluster_middleware(),
            forward_middleware(FORWARDER),
        ]
    if adopted is None or settings.engine_socket is None:
        return [
            *first,
            auth_middleware(TOKENS, LIMITER),
            cluster_middleware(),
            read_only_middleware(),
            audit_middleware(),
        ]
    first.insert(0, trusted_forwards(str(settings.engine_socket), worker_pids))
    return [
        *first,
        adopted.marking(),
        auth_middleware(TOKENS, LIMITER, functools.partial(_charged, str(settings.engine_socket))),
        adopted.counting(),
        cluster_middleware(),
        read_only_middleware(),
        audit_middleware(),
    ]


def _charged(engine_socket: str, request: web.Request) -> bool:
    """Whether a worker charged this request's token already: it forwarded it (it came on
    the engine socket) or handed its connection over (its first request)."""
    transport = request.transport
    on_engine = transport is not None and transport.get_extra_info("sockname") == engine_socket
    return on_engine or bool(request.get(FIRST, False))


def create_app(
    settings: Settings,
    clock: Clock | None = None,
    *,
    worker: int = 0,
    instance: str | None = None,
    listening: list[list[socket.socket]] | None = None,
) -> web.Application:
    """The service; `clock` is for tests that move time instead of sleeping. `worker`:
    which process of the service this is (0 writes; 1.. are workers, api/workers.py),
    `instance` the id they all answer health with; `listening`: the writing process's
    listening sockets for its workers, a set each (api/serve.py)."""
    adopted = None
    if not worker and settings.processes > 1:
        adopted = Adopted(settings.adopted_per_token, settings.adopted_connections)
    app = web.Application(
        client_max_size=settings.max_json_body,
        middlewares=_middlewares(settings, worker, adopted),
    )
    app[SETTINGS] = settings
    if adopted is not None:
        app[ADOPTED] = adopted
    app[UNHEADED] = Unheaded(
        settings.headless_per_client, settings.headless_connections, settings.spare_descriptors
    )
    app[INSTANCE] = instance or os.urandom(8).hex()
    app[WORKER] = worker
    app[LISTENING] = listening or []
    app[CLOCK] = clock or SystemClock()
    app[BODY_READERS] = BodyReaders()
    app[TURNS] = Turns(settings.workers_per_token or max(1, settings.worker_threads // 2))
    app[JOBS] = JobLog()
    app[METRICS] = Metrics(lambda: app[VAULT], app[JOBS])
    app.on_response_prepare.append(add_request_id_header)
    app.on_response_prepare.append(close_taken)
    app.on_shutdown.append(app[BODY_READERS].abort_all)
    app.on_shutdown.append(stop_jobs)  # before aiohttp waits for the handlers
    app.cleanup_ctx.append(_vault_context)
    app.cleanup_ctx.append(promotion_context)  # a worker's never runs (it cannot write)
    if worker:
        app.cleanup_ctx.append(_writer_context)
        app.cleanup_ctx.append(cluster_context)  # after the sink it wraps
        setup_routes(app)
        return app
    app.cleanup_ctx.append(jobs_context)  # after the vault opens, before it closes
    app.cleanup_ctx.append(maintenance_context)
    app.cleanup_ctx.append(cluster_context)  # its first beat before the port opens
    if settings.processes > 1 and listening:
        app.cleanup_ctx.append(_calls_context)  # closed after the workers stopped
        app.cleanup_ctx.append(workers_context(app[INSTANCE]))
        app.on_shutdown.append(stop_workers)
    setup_routes(app)
    return app
