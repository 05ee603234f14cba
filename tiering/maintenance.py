"""Maintenance that spans the engine and the tiers: GC, then repack of the packs it thinned.

GC (vault/gc.py) forgets packed chunks like any other, but their bytes stay in their packs
until a repack rewrites or deletes those packs. So with tiers, GC is always followed by a
repack, and this one function is what the schedule (api/scheduler.py) and the admin GC
route (api/routes/admin.py) both call.

It lives in tiering/ because that is the lowest layer that knows both halves: vault imports
none of our other packages (so `Vault.gc` cannot repack), and api is only the HTTP edge,
which must not own what an offline tool would also call.
"""

from __future__ import annotations

from dataclasses import replace

from protocol import GcReport
from vault import Vault

from .repack import repack
from .runner import repack_threshold


def gc_and_repack(vault: Vault, dry_run: bool = False) -> GcReport:
    """`Vault.gc`, then (tiers configured, not a dry run) a repack at the default policy's
    `repack_below`; both under one hold of the maintenance lock, waiting for it.

    Returns the GC report, with `packs_rewritten` and `pack_bytes_freed` set when it
    repacked.
    """
    with vault.maintenance.hold("gc"):
        report = vault.gc(dry_run)
        if vault.tiers and not dry_run:
            packs = repack(vault, repack_threshold(vault))
            report = replace(
                report, packs_rewritten=packs.rewritten, pack_bytes_freed=packs.dead_bytes_freed
            )
    return report


__all__ = ["gc_and_repack"]
