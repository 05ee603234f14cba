"""A worker process of `ckpt serve` (api/workers.py starts it: `python -m node.worker`).

It reads its `WorkerSpec` from standard input, dies with the writing process that started
it, holds its share of `workers.lock`, and accepts on the listening sockets it inherited
from that process: reads answered from the data dir's maps, everything else forwarded
(api/forward.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import sys
from collections.abc import Awaitable, Callable

from aiohttp import web
from checkpoint_vault.node.serve import inherited, tls_context, tune_malloc
from checkpoint_vault.node.supervisor import WorkerSpec, die_with_parent, hold_shared

from checkpoint_vault.vault.runtime import os_name

from .app import create_app
from .keys import UNHEADED
from .observability import AccessLogger, configure_logging


def _ready(ready: int, go: int) -> Callable[[web.Application], Awaitable[None]]:
    """on_startup, after the vault opened: say so, then wait for the writing process to
    let every worker accept at once (api/workers.py); its end of file means it died, and
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
    app = create_app(settings, worker=spec.index, instance=spec.instance)
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
