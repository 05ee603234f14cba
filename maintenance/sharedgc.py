"""The shared tier's part of a GC run (vault/content/sharedgc.py): this shard's mark, then
a sweep, after the node's own GC forgot what no checkpoint names any more.

Every process of a cluster with a shared tier does both on each GC (`ckpt gc`, the
schedule, POST /v1/admin/gc): a primary marks (a standby or fenced one only sweeps), any
process sweeps, and any number may sweep at once. A store that does not answer fails
neither the node's own GC nor its report: the figures say what happened, `shared_waiting`
why nothing was deleted.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from checkpoint_vault.protocol import GcReport
from checkpoint_vault.vault import Vault
from checkpoint_vault.vault.content.sharedcompact import compact
from checkpoint_vault.vault.content.sharedgc import Condemned, Sweeper, publish_mark
from checkpoint_vault.vault.errors import TierError

log = logging.getLogger("ckpt.sharedgc")


def shared_gc(vault: Vault, report: GcReport) -> GcReport:
    """`report` with the shared tier's figures added; `report` itself without one."""
    index = vault.store.shared
    gate = index.gate if index is not None else None
    if index is None or not isinstance(gate, Condemned):
        return report
    marked = merged = None
    try:
        epoch = vault.shared_epoch()
        if epoch is not None:
            mark = publish_mark(vault.store, gate, epoch)
            marked = len(mark.packs) if mark is not None else None
        config = vault.config
        swept = Sweeper(index, config.shared_shards, config.shared_gc_grace, gate.seg_times).sweep()
        if epoch is not None:  # a merge is a take: only a process that may take merges
            merged = compact(gate, config.shared_gc_grace, config.shared_index_fanin).merged
    except (TierError, ValueError, KeyError) as e:  # the store down, or an object damaged
        log.warning("shared tier GC: %s", e)
        return replace(
            report,
            shared_packs_marked=marked,
            shared_segments_merged=merged,
            shared_waiting=f"store: {e}",
        )
    if swept.deleted or swept.condemned:
        log.info(
            "shared tier GC: %d packs deleted (%d bytes), %d condemned, %d released; "
            "generation %d",
            swept.deleted, swept.bytes_freed, swept.condemned, swept.released, swept.generation,
        )  # fmt: skip
    return replace(
        report,
        shared_packs_marked=marked,
        shared_packs_condemned=swept.condemned,
        shared_packs_deleted=swept.deleted,
        shared_bytes_freed=swept.bytes_freed,
        shared_waiting=swept.waiting,
        shared_segments_merged=merged,
    )
