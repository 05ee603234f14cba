"""Maintenance: every long operation on a vault, its one way to run, and its schedule.

- `tasks.py`: the tasks (GC then repack, check, retention, scrub, compaction, tiering,
  catalog backup, usage scan), each answering its protocol record; the set the schedule runs.
- `sharedgc.py`: the shared tier's part of a GC run in a cluster: this shard's mark of the
  packs it names, then a sweep (vault/content/sharedgc.py).
- `run.py`: `run`, the one way a task runs: under the vault's maintenance lock, timed, its
  figures taken from its record.
- `queue.py`: `MaintenanceQueue`, where the service's tasks wait, one at a time on the
  runtime's `vault-maintenance` thread, bounded, stopped at shutdown.
- `schedule.py`: `Schedule`, which task is due next: a pure function of intervals and the
  times it is given.

A scheduled run, an admin route and an offline `ckpt` command all call `run` with a task
from `tasks.py`, so they do the same work under the same lock and report the same record.
The lock itself (`MaintenanceLock`, vault/maintenance.py) stays in the engine, which takes
it in its own long operations too (it is reentrant) and needs it for the restores that run
before any vault is open. The package stands above tiering (GC repacks packs) and below the
service, which only adds the event loop: it submits to the queue and awaits the answer,
and keeps the job log.
"""

from checkpoint_vault.vault.maintenance import MaintenanceLock

from .queue import QUEUE_LIMIT, MaintenanceQueue
from .run import Recorder, figures, run
from .schedule import Schedule
from .tasks import (
    MIN_RATE,
    Report,
    catalog_backup,
    check,
    check_rate,
    compact,
    gc,
    retention,
    scheduled,
    scrub,
    tiering,
    usage,
)

__all__ = [
    "MIN_RATE",
    "QUEUE_LIMIT",
    "MaintenanceLock",
    "MaintenanceQueue",
    "Recorder",
    "Report",
    "Schedule",
    "catalog_backup",
    "check",
    "check_rate",
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
