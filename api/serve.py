"""`ckpt serve`: run the service until SIGTERM or SIGINT, then shut down cleanly."""

from __future__ import annotations

import logging

from aiohttp import web

from .app import create_app
from .settings import Settings


def serve(settings: Settings) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("ckpt.api").info(
        "serving %s on http://%s:%d", settings.data_dir, settings.host, settings.port
    )
    # run_app turns SIGTERM into a graceful exit: stop accepting, let in-flight requests
    # finish (up to shutdown_timeout), then the cleanup context drains the writer and closes
    # LMDB; the process exits 0.
    web.run_app(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        shutdown_timeout=settings.shutdown_timeout,
        access_log=None,
        print=None,
    )
