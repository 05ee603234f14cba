"""A shard's lease: one object per epoch, created only if absent.

`shards/<k>/lease-<E:06d>` = {node, url, epoch} names the process that writes shard k at
epoch E, the epoch its replication writes under (vault/replication/layout.py). Claiming is
a conditional create (If-None-Match: *), which SeaweedFS 4.48 honours under races (four
concurrent creates, one winner, twenty rounds; a stale If-Match is refused too); a process
that finds a lease of its epoch naming someone else, or any newer epoch, is not the owner
and must not write (`ClusterConflict`, 409). A takeover promotes the shard's standby, whose
promotion claims the replica's next epoch (its fence) and then this lease of that epoch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from checkpoint_vault.vault.errors import ObjectExists
from checkpoint_vault.vault.tier import Tier

from .errors import ClusterConflict


@dataclass(frozen=True)
class Lease:
    shard: int
    epoch: int
    node: str
    url: str

    def encode(self) -> bytes:
        return json.dumps(
            {"shard": self.shard, "epoch": self.epoch, "node": self.node, "url": self.url}
        ).encode()


def lease_key(shard: int, epoch: int) -> str:
    return f"shards/{shard}/lease-{epoch:06d}"


def newest_epoch(tier: Tier, shard: int) -> int | None:
    """The highest epoch of `shard` anyone claimed, or None."""
    prefix = f"shards/{shard}/lease-"
    epochs = [int(k[len(prefix) :]) for k in tier.list(prefix) if k[len(prefix) :].isdigit()]
    return max(epochs, default=None)


def read(tier: Tier, shard: int, epoch: int) -> Lease:
    d = json.loads(tier.get(lease_key(shard, epoch)))
    return Lease(int(d["shard"]), int(d["epoch"]), str(d["node"]), str(d["url"]))


def claim(tier: Tier, lease: Lease) -> None:
    """Hold `lease` (blocking): create it, or find it already ours (a restart). Raises
    `ClusterConflict` when another process has this epoch or a newer one exists."""
    try:
        tier.put(lease_key(lease.shard, lease.epoch), lease.encode(), if_absent=True)
    except ObjectExists:
        held = read(tier, lease.shard, lease.epoch)
        if (held.node, held.url) != (lease.node, lease.url):
            raise ClusterConflict(
                f"shard {lease.shard} at epoch {lease.epoch} is held by {held.node} "
                f"({held.url}): this process takes no writes for it"
            ) from None
    check(tier, lease)


def check(tier: Tier, lease: Lease) -> None:
    """Raise `ClusterConflict` if a newer epoch of the shard was claimed (a takeover)."""
    newest = newest_epoch(tier, lease.shard)
    if newest is not None and newest > lease.epoch:
        raise ClusterConflict(
            f"shard {lease.shard} was taken over at epoch {newest} (this process held "
            f"{lease.epoch}): it takes no more writes for it"
        )
