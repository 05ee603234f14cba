"""Maintenance as the service runs it: tasks submitted to the `MaintenanceQueue`
(maintenance/queue.py), run one at a time by `maintenance.run` on the runtime's
`vault-maintenance` thread, their figures recorded in the job log (for metrics).

A route or the schedule only awaits the task's future (`asyncio.wrap_future`): while a task
waits for the lock or for the one before it, it holds no worker thread, so no number of
admin requests can take the pool from the tenants. Routes wait for their turn
(`timeout=None`), as they always have, unless the queue is full (409); the schedule submits
only when the queue is idle and does not wait for the lock (`timeout=0`), skipping a task
that finds maintenance busy. At shutdown `stop_jobs` (on_shutdown, before aiohttp waits
for the handlers) stops the running task at its next step and fails the queued ones with
`MaintenanceStopped` (503), so their requests answer and SIGTERM is not held up by a
compaction paced to days; the cleanup context waits for the thread before the runtime
closes the engine (a task without steps to stop at, a GC say, finishes first).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from aiohttp import web

from checkpoint_vault import maintenance

from .keys import JOBS, QUEUE, RUNTIME, SETTINGS, VAULT

R = TypeVar("R", bound=maintenance.Report)

log = logging.getLogger("ckpt.maintenance")


async def run_job(
    app: web.Application,
    job: str,
    task: Callable[[], R],
    timeout: float | None = None,
    if_idle: bool = False,
) -> R:
    """`maintenance.run(vault, job, task, timeout)` on the maintenance thread, into the job
    log; awaited without holding a thread. `if_idle`: refuse unless the queue is idle."""
    future = app[QUEUE].submit(job, task, timeout, if_idle)
    return await asyncio.wrap_future(future)


async def jobs_context(app: web.Application) -> AsyncIterator[None]:
    """Start the maintenance thread with the vault; join it before the runtime closes."""
    queue = maintenance.MaintenanceQueue(app[VAULT], app[RUNTIME].thread, app[JOBS].record)
    app[QUEUE] = queue
    try:
        yield
    finally:
        # Not `close` (a join) on the loop: await the thread's end. A task with no step to
        # stop at (a GC, a check) finishes first, as it did on the worker pool: closing the
        # engine under it would fail it half way, so past the timeout this says so and waits.
        queue.stop()
        finished = asyncio.wrap_future(queue.finished)
        try:
            await asyncio.wait_for(asyncio.shield(finished), app[SETTINGS].shutdown_timeout)
        except TimeoutError:
            log.warning(
                "maintenance %s is still running after the shutdown timeout; waiting for it",
                queue.running,
            )
            await finished


async def stop_jobs(app: web.Application) -> None:
    """on_shutdown: stop the running task at its next step, drop the queued ones."""
    queue = app.get(QUEUE)
    if queue is not None:
        queue.stop()


__all__ = ["jobs_context", "run_job", "stop_jobs"]
