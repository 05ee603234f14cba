"""Background maintenance: retention (apply), GC (and repack), scrub, compaction, tiering
and catalog backup, each on its own interval.

Every job is an engine operation that takes the vault's maintenance lock itself (the same
functions the admin routes and offline `ckpt` commands call); the schedule only picks the
time. Jobs run one at a time on the worker pool and never wait for the lock: a job that finds
maintenance busy (an operator's run through an admin route, say) is skipped, logged, and
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

from protocol import CompactReport
from tiering.maintenance import gc_and_repack
from tiering.runner import run_tiering
from vault import MaintenanceBusy, Vault

from .jobs import Report, run_job
from .keys import SETTINGS, VAULT

log = logging.getLogger("ckpt.maintenance")


def _jobs(vault: Vault, scrub_rate: float, compact_rate: float) -> dict[str, Callable[[], Report]]:
    """Each job is the engine operation the admin route calls, answering its record."""

    def compact() -> CompactReport:
        report = vault.compact(rate=compact_rate or None)
        if report.chunks_recoded or not vault.last_usage:
            vault.usage()  # the per-namespace figures /metrics shows
        return report

    return {
        "retention": lambda: vault.retention(dry_run=False),
        "gc": lambda: gc_and_repack(vault),
        "scrub": lambda: vault.verify(rate=scrub_rate or None),
        "compact": compact,
        "tiering": lambda: run_tiering(vault),
        "catalog_backup": lambda: vault.catalog_backup(None),
    }


async def _loop(app: web.Application) -> None:
    settings = app[SETTINGS].maintenance
    intervals = {
        "retention": settings.retention_interval,
        "gc": settings.gc_interval,
        "scrub": settings.scrub_interval,
        "compact": settings.compact_interval,
        "tiering": settings.tiering_interval if app[SETTINGS].tiers else 0.0,
        "catalog_backup": settings.backup_interval if app[SETTINGS].tiers else 0.0,
    }
    jobs = _jobs(app[VAULT], settings.scrub_rate, settings.compact_rate)
    due = {name: time.monotonic() + every for name, every in intervals.items() if every > 0}
    while due:
        name = min(due, key=due.__getitem__)
        await asyncio.sleep(max(0.0, due[name] - time.monotonic()))  # a timer, not a sync
        if app[VAULT].writable:  # a standby or a fenced primary changes nothing
            await _run(app, name, jobs[name])
        due[name] = time.monotonic() + intervals[name]


async def _run(app: web.Application, name: str, job: Callable[[], Report]) -> None:
    started = time.monotonic()
    try:
        result = await run_job(app, name, job, timeout=0)
    except MaintenanceBusy as e:
        log.info("maintenance %s skipped: %s", name, e)
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
