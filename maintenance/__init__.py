"""Maintenance: every long operation on a vault, its one way to run, and its schedule.

- `tasks.py`: the tasks (GC then repack, check, retention, scrub, compaction, tiering,
  catalog backup, usage scan), each answering its protocol record; the set the schedule runs.
- `run.py`: `run`, the one way a task runs: under the vault's maintenance lock, timed, its
  figures taken from its record.
- `schedule.py`: `Schedule`, which task is due next: a pure function of intervals and the
  times it is given.

A scheduled run, an admin route and an offline `ckpt` command all call `run` with a task
from `tasks.py`, so they do the same work under the same lock and report the same record.
The lock itself (`MaintenanceLock`, vault/maintenance.py) stays in the engine, which takes
it in its own long operations too (it is reentrant) and needs it for the restores that run
before any vault is open. The package stands above tiering (GC repacks packs) and below the
service, which only adds the event loop: the runtime's worker thread and the job log.
"""

from vault.maintenance import MaintenanceLock

from .run import Recorder, figures, run
from .schedule import Schedule
from .tasks import (
    Report,
    catalog_backup,
    check,
    compact,
    gc,
    retention,
    scheduled,
    scrub,
    tiering,
    usage,
)

__all__ = [
    "MaintenanceLock",
    "Recorder",
    "Report",
    "Schedule",
    "catalog_backup",
    "check",
    "compact",
    "figures",
    "gc",
    "retention",
    "run",
    "scheduled",
    "scrub",
    "tiering",
    "usage",
]
