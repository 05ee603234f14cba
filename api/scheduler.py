"""Background maintenance: retention (apply), GC (and repack), scrub, compaction, tiering,
catalog backup and the usage scan (a storage sample), each on its own interval.

Every job is a task of the maintenance package (maintenance/tasks.py), run by
`maintenance.run` as the admin routes and offline `ckpt` commands run it; when is
`maintenance.Schedule`'s answer, this loop only sleeps until then. Jobs go to the same
queue as the admin routes (api/jobs.py, the `vault-maintenance` thread), only when it is
idle, and never wait for the lock: a job that finds maintenance busy (an operator's run
through an admin route, queued or running, or another process's) is skipped, logged, and
tried again after its interval. Each logs a one-line JSON summary. An interval of 0
disables a job. Each job answers the same record its admin route does, and the log line
is that record's JSON. The scrub and compaction read at most `maintenance.scrub_rate` and
`maintenance.compact_rate` bytes per second so they never starve producers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from checkpoint_vault import maintenance
from checkpoint_vault.vault import MaintenanceBusy, MaintenanceStopped

from .jobs import run_job
from .keys import QUEUE, SETTINGS, VAULT

log = logging.getLogger("ckpt.maintenance")


async def _loop(app: web.Application) -> None:
    settings = app[SETTINGS].maintenance
    tiers = bool(app[SETTINGS].tiers)
    intervals = {
        "retention": settings.retention_interval,
        "gc": settings.gc_interval,
        "scrub": settings.scrub_interval,
        "compact": settings.compact_interval,
        "tiering": settings.tiering_interval if tiers else 0.0,
        "catalog_backup": settings.backup_interval if tiers else 0.0,
        "usage": settings.sample_interval,
    }
    tasks = maintenance.scheduled(
        app[VAULT],
        settings.scrub_rate or None,
        settings.compact_rate or None,
        app[QUEUE].stopping,
    )
    schedule = maintenance.Schedule(intervals, time.monotonic())
    while (due := schedule.next()) is not None:
        name, at = due
        await asyncio.sleep(max(0.0, at - time.monotonic()))  # a timer, not a sync
        if app[VAULT].roles.writable:  # a standby or a fenced primary changes nothing
            await _run(app, name, tasks[name])
        schedule.ran(name, time.monotonic())


async def _run(app: web.Application, name: str, task: Callable[[], maintenance.Report]) -> None:
    started = time.monotonic()
    try:
        result = await run_job(app, name, task, timeout=0, if_idle=True)
    except MaintenanceBusy as e:
        log.info("maintenance %s skipped: %s", name, e)
    except MaintenanceStopped:
        log.info("maintenance %s stopped: the server is shutting down", name)
    except Exception:
        log.exception("maintenance %s failed", name)
    else:
        log.info(
            "maintenance %s done in %.1fs: %s",
            name,
            time.monotonic() - started,
            json.dumps(result.to_wire()),
        )


async def maintenance_context(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.ensure_future(_loop(app))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


__all__ = ["maintenance_context"]
