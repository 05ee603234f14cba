"""The application factory: one `create_app(settings)` for the entry point, tests and tools.

Owns the app state (vault, worker pool, token cache) under typed AppKeys, opened and closed
in one cleanup context, so SIGTERM drains in-flight requests, finishes queued writes and
closes LMDB cleanly.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from client.protocol import ADMIN_TOKEN_FILE
from tiering import open_tier
from tiering.wrappers import RetryingTier
from vault import Clock, Keyring, SystemClock, Unavailable, Vault

from .auth import TokenCache, auth_middleware
from .errors import error_middleware
from .observability import (
    JobLog,
    Metrics,
    add_request_id_header,
    metrics_middleware,
    request_id_middleware,
)
from .settings import Settings

log = logging.getLogger("ckpt.api")
T = TypeVar("T")

SETTINGS = web.AppKey("settings", Settings)
VAULT = web.AppKey("vault", Vault)
POOL = web.AppKey("pool", ThreadPoolExecutor)
TOKENS = web.AppKey("tokens", TokenCache)
CLOCK = web.AppKey("clock", Clock)


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


BODY_READERS = web.AppKey("body_readers", BodyReaders)
# Retention, GC, verify and check run one at a time, whether an operator or the schedule
# starts them: each is a long scan, and two at once would only slow producers down.
MAINTENANCE = web.AppKey("maintenance", asyncio.Lock)
JOBS = web.AppKey("jobs", JobLog)
METRICS = web.AppKey("metrics", Metrics)


def reading_body(request: web.Request) -> AbstractContextManager[None]:
    """Mark the current handler as reading its body, so shutdown may abort it."""
    return request.app[BODY_READERS].track()


async def run(request: web.Request, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run blocking engine work on the worker pool, off the event loop."""
    loop = asyncio.get_running_loop()
    call = functools.partial(fn, *args, **kwargs)
    return await loop.run_in_executor(request.app[POOL], call)


def refresh_tokens(app: web.Application) -> None:
    app[TOKENS].reload(app[VAULT].tokens.all())


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
    pool = ThreadPoolExecutor(settings.worker_threads, thread_name_prefix="vault-io")
    tiers = {
        name: RetryingTier(
            open_tier(name, spec["url"], {k: v for k, v in spec.items() if k != "url"})
        )
        for name, spec in settings.tiers.items()
    }
    keyring = Keyring.load(settings.key_file) if settings.key_file is not None else None
    vault = await asyncio.get_running_loop().run_in_executor(
        pool,
        functools.partial(
            Vault, settings.data_dir / "vault", settings.vault, app[CLOCK], tiers, keyring
        ),
    )
    app[POOL] = pool
    app[VAULT] = vault
    _bootstrap_admin(vault, settings.data_dir)
    app[TOKENS] = TokenCache(vault.tokens.all())
    try:
        yield
    finally:
        pool.shutdown(wait=True)
        vault.close()


def create_app(settings: Settings, clock: Clock | None = None) -> web.Application:
    """The service; `clock` is for tests that move time instead of sleeping."""
    from .promotion import promotion_context
    from .routes import setup_routes
    from .scheduler import maintenance_context

    app = web.Application(
        client_max_size=settings.max_json_body,
        middlewares=[
            request_id_middleware,
            metrics_middleware(METRICS),
            error_middleware,
            auth_middleware(TOKENS),
        ],
    )
    app[SETTINGS] = settings
    app[CLOCK] = clock or SystemClock()
    app[BODY_READERS] = BodyReaders()
    app[MAINTENANCE] = asyncio.Lock()
    app[JOBS] = JobLog()
    app[METRICS] = Metrics(lambda: app[VAULT], app[JOBS])
    app.on_response_prepare.append(add_request_id_header)
    app.on_shutdown.append(app[BODY_READERS].abort_all)
    app.cleanup_ctx.append(_vault_context)
    app.cleanup_ctx.append(maintenance_context)
    app.cleanup_ctx.append(promotion_context)
    setup_routes(app)
    return app
