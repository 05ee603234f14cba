"""Promotion on read: a download of a checkpoint whose bytes are in another tier (with the
namespace's `promote_on_read` on) brings them back hot in the background. The download
itself is served from the cold tier as usual and never waits for it; one promotion per
checkpoint runs at a time, and shutdown waits for those under way (each is a few writer
transactions; a SIGKILL mid-way leaves chunks either packed or hot, both readable)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from checkpoint_vault.tiering.runner import promote_checkpoint, wants_promotion
from checkpoint_vault.vault import StoredCheckpoint

from .keys import JOBS, RUNTIME, VAULT
from .observability import timed

log = logging.getLogger("ckpt.tiering")


class Promotions:
    def __init__(self) -> None:
        self._running: dict[str, asyncio.Task[None]] = {}

    def after_read(self, app: web.Application, record: StoredCheckpoint) -> None:
        """Called on every file read; cheap unless the checkpoint has cold bytes."""
        if record.tier == "hot" or record.id in self._running or not app[VAULT].roles.writable:
            return
        if not wants_promotion(app[VAULT], record.namespace, record):
            return
        task = asyncio.get_running_loop().create_task(self._promote(app, record))
        self._running[record.id] = task
        task.add_done_callback(lambda _: self._running.pop(record.id, None))

    async def _promote(self, app: web.Application, record: StoredCheckpoint) -> None:
        loop = asyncio.get_running_loop()
        try:
            with timed(app[JOBS], "promotion"):
                result = await loop.run_in_executor(
                    app[RUNTIME].io, promote_checkpoint, app[VAULT], record.namespace, record.id
                )
        except Exception:  # a tier outage, say: the next read tries again
            log.exception("promotion of %s failed", record.id)
        else:
            log.info("promoted %s: %s chunks", record.id, result.moved.chunks)

    async def drain(self) -> None:
        if self._running:
            await asyncio.gather(*self._running.values(), return_exceptions=True)


PROMOTIONS = web.AppKey("promotions", Promotions)


async def promotion_context(app: web.Application) -> AsyncIterator[None]:
    """Registered after the vault's context, so it is cleaned up first: promotions under
    way finish before the vault closes."""
    app[PROMOTIONS] = Promotions()
    yield
    await app[PROMOTIONS].drain()
