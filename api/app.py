"""The application factory: one `create_app(settings)` for the entry point, tests and tools.

Builds the app state (vault, worker pool, token cache; the AppKeys themselves are in
api/keys.py) in one cleanup context, so SIGTERM drains in-flight requests, finishes queued
writes and closes LMDB cleanly. Only entry points (`api/__init__.py`, `api/serve.py`) import
this module; everything else imports api/keys.py.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from protocol import ADMIN_TOKEN_FILE
from vault import Clock, SystemClock, Vault
from vault.env import make_private
from vault.runtime import PoolSizes, Runtime

from .audit import audit_middleware
from .auth import TokenCache, auth_middleware
from .bodies import BodyReaders
from .engine import open_vault
from .errors import error_middleware
from .jobs import jobs_context, stop_jobs
from .keys import (
    BODY_READERS,
    CLOCK,
    INSTANCE,
    JOBS,
    LIMITER,
    METRICS,
    RUNTIME,
    SETTINGS,
    TOKENS,
    TURNS,
    VAULT,
)
from .observability import (
    JobLog,
    Metrics,
    add_request_id_header,
    metrics_middleware,
    request_id_middleware,
)
from .promotion import promotion_context
from .ratelimit import RateLimiter
from .receive import close_taken
from .roles import follow_tokens, read_only_middleware
from .routes import setup_routes
from .scheduler import maintenance_context
from .settings import Settings
from .turns import Turns

log = logging.getLogger("ckpt.api")


def _bootstrap_admin(vault: Vault, data_dir: Path) -> None:
    """First start with no tokens: create an admin token and write it, mode 0600."""
    if vault.tokens.all():
        return
    _, secret = vault.tokens.create("admin", ["admin"])
    path = data_dir / ADMIN_TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    log.warning("created an admin token; it is in %s (mode 0600)", path)


async def _vault_context(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    make_private(settings.data_dir)  # 0700 and its files 0600, whatever the umask
    runtime = Runtime(PoolSizes(io=settings.worker_threads))
    loop = asyncio.get_running_loop()
    try:
        vault = await loop.run_in_executor(
            runtime.io, functools.partial(open_vault, settings, app[CLOCK], runtime)
        )
    except BaseException:
        runtime.close()
        raise
    app[RUNTIME] = runtime
    app[VAULT] = vault
    if vault.roles.writable:  # a standby's tokens are the primary's (replicated)
        _bootstrap_admin(vault, settings.data_dir)
    app[TOKENS] = TokenCache(vault.tokens.all(), app[CLOCK])
    follow_tokens(app, vault)
    try:
        yield
    finally:
        # On a thread of its own, not the loop: a download's pin is let go by a callback
        # on the loop, and closing the environments waits for every pin.
        uses = app[TOKENS].take_uses()
        await asyncio.wrap_future(runtime.close_in_thread(functools.partial(_close, vault, uses)))


def _close(vault: Vault, uses: dict[str, float]) -> None:
    """The engine's part of the runtime's shutdown order (vault/runtime.py): by now the
    request pools have finished (senders within PIN_SECONDS of a stalled client; receivers
    woken and hand-overs told to stop when shutdown aborted the handlers)."""
    vault.tokens.record_use(uses)
    vault.close()


def create_app(settings: Settings, clock: Clock | None = None) -> web.Application:
    """The service; `clock` is for tests that move time instead of sleeping."""
    app = web.Application(
        client_max_size=settings.max_json_body,
        middlewares=[
            request_id_middleware,
            metrics_middleware(METRICS),
            error_middleware,
            auth_middleware(TOKENS, LIMITER),
            read_only_middleware(),
            audit_middleware(),
        ],
    )
    app[SETTINGS] = settings
    app[INSTANCE] = os.urandom(8).hex()
    app[CLOCK] = clock or SystemClock()
    app[LIMITER] = RateLimiter(settings.requests_per_second, settings.request_burst, app[CLOCK])
    app[BODY_READERS] = BodyReaders()
    app[TURNS] = Turns(settings.workers_per_token or max(1, settings.worker_threads // 2))
    app[JOBS] = JobLog()
    app[METRICS] = Metrics(lambda: app[VAULT], app[JOBS])
    app.on_response_prepare.append(add_request_id_header)
    app.on_response_prepare.append(close_taken)
    app.on_shutdown.append(app[BODY_READERS].abort_all)
    app.on_shutdown.append(stop_jobs)  # before aiohttp waits for the handlers
    app.cleanup_ctx.append(_vault_context)
    app.cleanup_ctx.append(jobs_context)  # after the vault opens, before it closes
    app.cleanup_ctx.append(maintenance_context)
    app.cleanup_ctx.append(promotion_context)
    setup_routes(app)
    return app
