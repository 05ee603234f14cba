"""Background maintenance: retention (apply), GC and scrub on their own intervals.

Jobs run one at a time (they share the maintenance lock with the admin routes), each on the
worker pool, and each logs what it did. An interval of 0 disables a job. The scrub reads at
most `maintenance.scrub_rate` bytes per second so it never starves producers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from aiohttp import web

from tiering.repack import repack
from tiering.runner import repack_threshold, run_tiering
from vault import Vault

from .app import JOBS, MAINTENANCE, POOL, SETTINGS, VAULT
from .catalog_backup import backup
from .observability import timed

log = logging.getLogger("ckpt.maintenance")


def _jobs(
    vault: Vault, scrub_rate: float, data_dir: Path
) -> dict[str, Callable[[], dict[str, Any]]]:
    def retention() -> dict[str, Any]:
        result = vault.retention(dry_run=False)
        return {
            "deleted": len(result.deleted),
            "kept": sum(len(p.keep) for p in result.plans),
            "reclaimable_bytes": sum(p.reclaimable_bytes for p in result.plans),
        }

    def gc() -> dict[str, Any]:
        """Then repack: packed chunks GC freed are dead bytes in their packs."""
        result = asdict(vault.gc())
        if vault.store.tiers:
            packs = repack(vault, repack_threshold(vault))
            result["packs_rewritten"] = packs.rewritten
            result["pack_bytes_freed"] = packs.dead_bytes_freed
        return result

    def scrub() -> dict[str, Any]:
        report = vault.verify(rate=scrub_rate or None)
        return {
            "chunks_checked": report.chunks_checked,
            "corrupt": len(report.corrupt),
            "corrupt_ids": report.corrupt,
            "invalidated": report.checkpoints_invalidated,
            "healed": report.checkpoints_healed,
            "mb_per_s": round(report.mb_per_s, 1),
        }

    def tiering() -> dict[str, Any]:
        result = run_tiering(vault)
        return {
            "bytes_moved": sum(m["bytes"] for m in result["moved"].values()),
            "retiered": len(result["retiered"]),
        }

    def catalog_backup() -> dict[str, Any]:
        return backup(vault, data_dir, None)

    return {
        "retention": retention,
        "gc": gc,
        "scrub": scrub,
        "tiering": tiering,
        "catalog_backup": catalog_backup,
    }


async def _loop(app: web.Application) -> None:
    settings = app[SETTINGS].maintenance
    intervals = {
        "retention": settings.retention_interval,
        "gc": settings.gc_interval,
        "scrub": settings.scrub_interval,
        "tiering": settings.tiering_interval if app[SETTINGS].tiers else 0.0,
        "catalog_backup": settings.backup_interval if app[SETTINGS].tiers else 0.0,
    }
    jobs = _jobs(app[VAULT], settings.scrub_rate, app[SETTINGS].data_dir)
    loop = asyncio.get_running_loop()
    due = {name: time.monotonic() + every for name, every in intervals.items() if every > 0}
    while due:
        name = min(due, key=due.__getitem__)
        await asyncio.sleep(max(0.0, due[name] - time.monotonic()))  # a timer, not a sync
        started = time.monotonic()
        try:
            async with app[MAINTENANCE]:
                with timed(app[JOBS], name) as numbers:
                    result = await loop.run_in_executor(app[POOL], jobs[name])
                    numbers.update(
                        {
                            k: float(v)
                            for k, v in result.items()
                            if isinstance(v, (int, float)) and not isinstance(v, bool)
                        }
                    )
        except Exception:
            log.exception("maintenance %s failed", name)
        else:
            log.info(
                "maintenance %s done in %.1fs: %s",
                name,
                time.monotonic() - started,
                json.dumps(result, default=str),
            )
        due[name] = time.monotonic() + intervals[name]


async def maintenance_context(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.ensure_future(_loop(app))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


__all__ = ["maintenance_context"]
