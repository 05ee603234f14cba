"""Maintenance as the service runs it: `maintenance.run` on the runtime's worker pool, its
figures recorded in the job log (for metrics). The event loop only awaits the worker; it
never blocks on the maintenance lock. Routes wait for the lock (`timeout=None`), as they
always have; the schedule does not (`timeout=0`) and skips a task that finds it busy.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import TypeVar

from aiohttp import web

import maintenance

from .keys import JOBS, RUNTIME, VAULT

R = TypeVar("R", bound=maintenance.Report)


async def run_job(
    app: web.Application, job: str, task: Callable[[], R], timeout: float | None = None
) -> R:
    """`maintenance.run(vault, job, task, timeout)` on the worker pool, into the job log."""
    call = functools.partial(maintenance.run, app[VAULT], job, task, timeout, app[JOBS].record)
    return await asyncio.get_running_loop().run_in_executor(app[RUNTIME].io, call)
