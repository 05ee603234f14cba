"""The maintenance tasks: what each long operation does, whoever asked for it.

Each is a function of the vault and its own parameters that answers its protocol record
(protocol/_maintenance.py), and each is what the admin route, the schedule and the offline
command run (through `run`, which holds the lock). `scheduled` is the set the schedule runs,
with the parameters the settings give.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Protocol

from checkpoint_vault.protocol import (
    CatalogBackup,
    CheckReport,
    CompactReport,
    GcReport,
    RetentionReport,
    TieringReport,
    VerifyReport,
)
from checkpoint_vault.tiering.repack import repack
from checkpoint_vault.tiering.runner import repack_threshold, run_tiering
from checkpoint_vault.vault import InvalidRequest, Vault
from checkpoint_vault.vault.samples import StorageSample

from .sharedgc import shared_gc

log = logging.getLogger(__name__)

# The slowest rate a caller may ask of a paced task (compaction, scrub): 1 MiB/s. Below it
# a run is a way to hold the maintenance lock (and everything queued behind it) for days:
# `rate=1` on a 100 GB vault is three thousand years.
MIN_RATE = 1 << 20


def check_rate(rate: float | None) -> float | None:
    """`rate` if it is None (no limit) or at least `MIN_RATE` bytes per second; else
    `InvalidRequest` (400), before anything is queued."""
    if rate is not None and rate < MIN_RATE:
        raise InvalidRequest(
            f"rate must be at least {MIN_RATE} bytes per second (1MiB), or left out for none"
        )
    return rate


class Report(Protocol):
    """What a task answers: a protocol record."""

    def to_wire(self) -> Mapping[str, object]: ...


def gc(vault: Vault, dry_run: bool = False, stop: threading.Event | None = None) -> GcReport:
    """Collect expired uploads and chunks unreferenced past the grace period; with tiers
    (not a dry run), then repack at the default policy's `repack_below`: GC forgets packed
    chunks like any other, but their bytes stay in their packs until a repack. One hold of
    the lock (`run`'s) around both. In a cluster with a shared tier, then this shard's
    mark and a sweep of the shared tier (sharedgc.py). `stop` set: stop at the next batch
    (`MaintenanceStopped`), before the repack."""
    report = vault.gc(dry_run, stop)
    if vault.tiers and not dry_run:
        packs = repack(vault, repack_threshold(vault))
        report = replace(
            report, packs_rewritten=packs.rewritten, pack_bytes_freed=packs.dead_bytes_freed
        )
    if not dry_run:
        report = shared_gc(vault, report)  # after the node's own GC: its mark omits what went
        shrink(vault)
    return report


def check(vault: Vault, repair: bool = False, stop: threading.Event | None = None) -> CheckReport:
    """Recompute every reference count from the manifests; `repair` fixes what drifted.
    `stop` set: stop mid-scan (`MaintenanceStopped`), before any repair."""
    return vault.check(repair, stop)


def retention(vault: Vault, dry_run: bool = True, namespace: str | None = None) -> RetentionReport:
    """Plan retention, or apply exactly that plan."""
    return vault.retention(dry_run, namespace)


def scrub(
    vault: Vault,
    namespace: str | None = None,
    sample: float = 1.0,
    rate: float | None = None,
    stop: threading.Event | None = None,
) -> VerifyReport:
    """Re-read chunks and check their ids: what uses a damaged one is marked invalid.
    `stop` set: stop at the next batch (`MaintenanceStopped`)."""
    return vault.verify(namespace, sample, rate, stop)


def compact(
    vault: Vault,
    namespace: str | None = None,
    rate: float | None = None,
    stop: threading.Event | None = None,
) -> CompactReport:
    """Re-encode older checkpoints as deltas against their successors; refresh the
    per-namespace usage /metrics shows when it changed (or was never taken). `stop` set:
    stop at the next batch (`MaintenanceStopped`)."""
    report = vault.compact(namespace, rate, stop=stop)
    shrink(vault)
    if report.chunks_recoded or not vault.last_usage:
        vault.usage()
    return report


def tiering(
    vault: Vault, dry_run: bool = True, stop: threading.Event | None = None
) -> TieringReport:
    """Plan, or run, demotion and promotion by the tiering policies (then shrink the hot
    store, which demotion leaves pages free in). `stop` set: stop at the next batch
    (`MaintenanceStopped`)."""
    report = run_tiering(vault, dry_run, stop)
    if not dry_run:
        shrink(vault)
    return report


def shrink(vault: Vault) -> None:
    """After compaction, GC or demotion freed pages of the hot store: give them back to the
    file system if its reclaimable bytes pass `[storage] shrink_above` of those in use
    (vault/shrink.py), pauses of the writer of up to ~0.1 s each; one log line when it did.
    Logged, not reported: the task's own record stays what it was, and /v1/stats shows the
    disk. Not on a standby or a fenced primary, whose writer takes no changes (a standby's
    pages are freed by the log it applies, and shrunk once it is promoted)."""
    if not vault.roles.writable:
        return
    done = vault.shrink()
    if done is not None:
        log.info(
            "shrink: %d free pages given back, hot store %d -> %d bytes on disk, %.3f s in %d"
            " pauses of the writer",
            done.pages,
            done.allocated_before,
            done.allocated_after,
            done.seconds,
            done.slices,
        )


def catalog_backup(vault: Vault, to: str | None = None) -> CatalogBackup:
    """A consistent copy of the catalog, to a tier or a file."""
    return vault.catalog_backup(to)


def usage(vault: Vault) -> StorageSample:
    """Scan every namespace's stored and logical bytes (a read of every manifest), for
    /metrics and the console: the scan records a storage sample, which this answers."""
    vault.usage()
    sample = vault.samples.newest()
    assert sample is not None  # the scan just took one
    return sample


def scheduled(
    vault: Vault,
    scrub_rate: float | None,
    compact_rate: float | None,
    stop: threading.Event | None = None,
) -> dict[str, Callable[[], Report]]:
    """The tasks the schedule runs, by job name, with the settings' parameters: retention
    applied, GC (and repack), a full scrub and compaction at their rates, a tiering run
    (each stopping when `stop` is set), a catalog backup to the last tier, a usage scan (a
    storage sample)."""
    return {
        "retention": lambda: retention(vault, dry_run=False),
        "gc": lambda: gc(vault, stop=stop),
        "scrub": lambda: scrub(vault, rate=scrub_rate, stop=stop),
        "compact": lambda: compact(vault, rate=compact_rate, stop=stop),
        "tiering": lambda: tiering(vault, dry_run=False, stop=stop),
        "catalog_backup": lambda: catalog_backup(vault),
        "usage": lambda: usage(vault),
    }
