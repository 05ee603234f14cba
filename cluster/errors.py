"""The cluster's refusals, as engine errors: their wire codes are the protocol's own, so
api/errors.py maps them like every other `VaultError`."""

from __future__ import annotations

from checkpoint_vault.vault.errors import Fenced, Unavailable


class NotOwner(Unavailable):
    """This process does not own the namespace's shard and knows no live owner to forward
    to (all of its processes down, or a takeover under way): retry shortly."""

    # Seconds a client waits before trying again: a takeover or a move takes a few (the
    # Retry-After of other 503s, 5 s, would hold producers well past it).
    retry_after = 2


class ClusterConflict(Fenced):
    """Another process holds this shard's lease at this epoch or a newer one: this one must
    not write the shard (two configured primaries, or one that lost a takeover)."""
