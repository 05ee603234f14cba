"""The application factory: one `create_app(settings)` for the entry points, tests and tools.

Builds the HTTP core's state (vault, pools, token cache; the AppKeys themselves are in
api/keys.py) in one cleanup context, so SIGTERM drains in-flight requests, finishes queued
writes and closes LMDB cleanly. What differs between the processes of one service comes in
as a `Role` (api/process.py): `Alone` here, the writer and its workers in node/. Only entry
points import this module; everything else imports api/keys.py.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

from checkpoint_vault.protocol import ADMIN_TOKEN_FILE
from checkpoint_vault.vault import Clock, SystemClock, Vault
from checkpoint_vault.vault.direct import SaveOptions
from checkpoint_vault.vault.ownership import open_private, prepare_data_dir
from checkpoint_vault.vault.runtime import PoolSizes, Runtime

from .audit import audit_middleware
from .auth import TokenCache, auth_middleware
from .cluster import cluster_context, cluster_middleware, passed_on
from .cluster.parts import parts_context
from .cluster.signed import signed_principal
from .engine import no_readers, open_vault
from .errors import error_middleware
from .heads import Unheaded, headed_middleware
from .http import run, run_small
from .jobs import jobs_context, stop_jobs
from .keys import (
    BODY_READERS,
    CLOCK,
    INSTANCE,
    JOBS,
    LIMITER,
    METRICS,
    ROLE,
    RUNTIME,
    SAVES,
    SETTINGS,
    TOKENS,
    TURNS,
    UNHEADED,
    VAULT,
)
from .observability import (
    JobLog,
    Metrics,
    RequestIds,
    add_request_id_header,
    metrics_middleware,
    request_id_middleware,
)
from .process import Role
from .ratelimit import LIMITS_FILE, RateLimiter
from .roles import follow_tokens, read_only_middleware
from .routes import setup_routes
from .s3 import s3_context
from .saving import PendingSave, Saved, prepare_all
from .scheduler import maintenance_context
from .settings import Settings
from .transfer.bodies import BodyReaders
from .transfer.promotion import promotion_context
from .transfer.receive import close_taken
from .turns import Turns
from .txn import txn_context, txn_middleware

log = logging.getLogger("ckpt.api")


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
    it (api/engine.py); a worker opens it to read."""
    if reader:
        return open_vault(settings, clock, runtime, reader=True)
    with no_readers(settings):
        return open_vault(settings, clock, runtime)


async def _vault_context(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    reader = app[ROLE].reader
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
    if not reader:  # a worker's saves go to the writing process (node/worker.py)
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


class LocalSink:
    """The process that writes: each save goes to its own writer, the first committing
    while the rest are prepared."""

    def __init__(self, vault: Vault) -> None:
        self._vault = vault

    async def save(
        self, request: web.Request, ns: str, files: dict[str, bytes], options: SaveOptions
    ) -> Saved:
        return await run(request, self._vault.save, ns, files, **options)

    async def save_all(self, request: web.Request, saves: list[PendingSave]) -> None:
        vault = self._vault
        size = sum(s.size for s in saves)
        committing = await run_small(
            request, size, prepare_all, vault, saves, vault.commit_prepared
        )
        outcomes = await asyncio.gather(
            *(asyncio.wrap_future(f) for _, f in committing), return_exceptions=True
        )
        for (save, _), outcome in zip(committing, outcomes, strict=True):
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome  # cancelled: the client went away
            save.outcome = outcome


class Alone:
    """The role of a service in one process: it writes, and no other process reads its
    data dir."""

    index = 0
    reader = False

    def middlewares(self, first: list[Middleware]) -> list[Middleware]:
        return [
            *first,
            auth_middleware(TOKENS, LIMITER, passed_on, signed_principal),
            cluster_middleware(),
            txn_middleware(),  # after it: only the namespace's owner settles (api/txn/)
            read_only_middleware(),
            audit_middleware(),
        ]

    def install(self, app: web.Application) -> None:
        pass

    async def peer_metrics(self, app: web.Application) -> list[str]:
        return []


def create_app(
    settings: Settings,
    clock: Clock | None = None,
    *,
    instance: str | None = None,
    role: Role | None = None,
) -> web.Application:
    """The service; `clock` is for tests that move time instead of sleeping. `instance`:
    the id every process of the service answers health with; `role`: which process of the
    service this is (`Alone` unless node/ says otherwise)."""
    role = role or Alone()
    first = [
        headed_middleware(UNHEADED),
        request_id_middleware(RequestIds()),
        metrics_middleware(METRICS),
        error_middleware,
    ]
    app = web.Application(
        client_max_size=settings.max_json_body, middlewares=role.middlewares(first)
    )
    app[SETTINGS] = settings
    app[ROLE] = role
    app[UNHEADED] = Unheaded(
        settings.headless_per_client, settings.headless_connections, settings.spare_descriptors
    )
    app[INSTANCE] = instance or os.urandom(8).hex()
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
    app.cleanup_ctx.append(promotion_context)  # a reader's never runs (it cannot write)
    app.cleanup_ctx.append(parts_context)  # parts' shipping and expiry (vault/parts.py)
    if not role.reader:
        app.cleanup_ctx.append(jobs_context)  # after the vault opens, before it closes
        app.cleanup_ctx.append(maintenance_context)
        app.cleanup_ctx.append(s3_context)  # [s3] port: the S3 endpoint (api/s3/), off unset
    if role.reader:  # its sink (the channel) first: the cluster's wraps it
        role.install(app)
        app.cleanup_ctx.append(cluster_context)
    else:  # its first beat before workers may accept (api/cluster/context.py)
        app.cleanup_ctx.append(cluster_context)
        role.install(app)
    app.cleanup_ctx.append(txn_context)  # commits across namespaces (api/txn/)
    setup_routes(app)
    return app
