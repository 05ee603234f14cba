"""Maintenance as the service runs it: an engine operation on the worker pool, timed into
the job log (for metrics) once it holds the vault's maintenance lock.

The operations take the lock themselves (vault/maintenance.py); holding it here first, on
the same worker thread (the lock is reentrant), decides how long to wait and keeps the wait
out of the job's recorded duration. Routes wait (`timeout=None`), as they always have; the
schedule does not (`timeout=0`) and skips a job that finds maintenance busy. The event loop
only awaits the worker; it never blocks on the lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

from aiohttp import web

from protocol import TieringReport

from .keys import JOBS, RUNTIME, VAULT
from .observability import timed


class Report(Protocol):
    """What a maintenance job answers: a protocol record (protocol/_maintenance.py)."""

    def to_wire(self) -> Mapping[str, object]: ...


R = TypeVar("R", bound=Report)


def numbers(report: Report) -> dict[str, float]:
    """The figures of a job's answer for the job log: the numbers of its record's JSON, a
    list counted by its length (ids deleted, checkpoints retiered); a tiering run adds the
    bytes it moved, which are nested per tier."""
    out: dict[str, float] = {}
    for k, v in report.to_wire().items():
        if isinstance(v, list):
            out[k] = float(len(v))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = float(v)
    if isinstance(report, TieringReport) and report.moved is not None:
        out["bytes_moved"] = float(sum(m.bytes for m in report.moved.values()))
    return out


async def run_job(
    app: web.Application, job: str, operation: Callable[[], R], timeout: float | None = None
) -> R:
    """Run `operation` on the worker pool under the maintenance lock (waiting as `timeout`
    says; busy raises `MaintenanceBusy`), recording its duration and `numbers(result)`."""
    vault, jobs = app[VAULT], app[JOBS]

    def held() -> R:
        with vault.maintenance.hold(job, timeout), timed(jobs, job) as recorded:
            result = operation()
            recorded.update(numbers(result))
            return result

    return await asyncio.get_running_loop().run_in_executor(app[RUNTIME].io, held)
