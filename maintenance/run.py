"""`run`: the one way a maintenance task runs, for the schedule, a route and a command.

It holds the vault's maintenance lock around the whole task (GC and its repack are one
hold), waiting as `timeout` says: routes and offline commands wait (None), the schedule does
not (0) and skips a task that finds maintenance busy (`MaintenanceBusy`, 409). The task's
duration is measured from when the lock is held, so a wait is not counted as work, and is
handed with the outcome and the record's figures to `record` (the service's job log).
Blocking: the service runs it on its maintenance thread (queue.py), never the worker pool.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from checkpoint_vault.protocol import TieringReport
from checkpoint_vault.vault import Vault

from .tasks import Report

R = TypeVar("R", bound=Report)
# (job, seconds, ok, figures): one call per run that held the lock.
Recorder = Callable[[str, float, bool, dict[str, float]], None]


def run(
    vault: Vault,
    job: str,
    task: Callable[[], R],
    timeout: float | None = None,
    record: Recorder | None = None,
) -> R:
    """Run `task` (a function of tasks.py, its parameters bound) as `job` under the lock."""
    with vault.maintenance.hold(job, timeout):
        started = time.perf_counter()
        report: R | None = None
        try:
            report = task()
            return report
        finally:
            if record is not None:
                ok = report is not None
                numbers = figures(report) if report is not None else {}
                record(job, time.perf_counter() - started, ok, numbers)


def figures(report: Report) -> dict[str, float]:
    """The figures of a task's record, for the job log: the numbers of its JSON, a list
    counted by its length (ids deleted, checkpoints retiered); a tiering run adds the bytes
    it moved, which are nested per tier."""
    out: dict[str, float] = {}
    for k, v in report.to_wire().items():
        if isinstance(v, list):
            out[k] = float(len(v))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = float(v)
    if isinstance(report, TieringReport) and report.moved is not None:
        out["bytes_moved"] = float(sum(m.bytes for m in report.moved.values()))
    return out
