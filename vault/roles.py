"""`Roles`: what a vault is to its peers, and the one change of role it can make.

A vault is `primary` (writes; with `[replication]` its changes go to a replica in a tier),
`standby` (opened with `follow`: read-only, kept at that replica by its follower until
`promote`) or `fenced` (a primary a promotion has overtaken: read-only for good). Only the
writer decides what is refused, so every write path answers the same typed error; this
object sets the refusal, owns the replicator and the follower, and promotes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from checkpoint_vault.protocol import Promotion

from .errors import Conflict, InvalidRequest, PromotionConflict, ReadOnlyStandby
from .replication import FollowConfig, Follower, ReplicationConfig, Replicator, is_standby
from .replication.follow import FollowParts
from .replication.shipper import ShipperParts
from .writer import WriteTxn

if TYPE_CHECKING:
    from .tier import Tier


class RoleParts(FollowParts, ShipperParts, Protocol):
    """What the roles need of the store: what following and replicating need, the tiers,
    taking the data dir over at promotion, and the replica barrier, which they set."""

    replica_barrier: Callable[[float], bool] | None  # settable: set when replication starts

    @property
    def tiers(self) -> Mapping[str, Tier]: ...
    def take_over(self) -> None: ...


class Roles:
    def __init__(
        self,
        store: RoleParts,
        path: Path,
        replication: ReplicationConfig | None,
        follow: FollowConfig | None,
    ) -> None:
        """`follow`: a standby of that tier's replica; `replication` is then what the vault
        replicates with once promoted (default: async, to the followed tier)."""
        self._s = store
        self._path = path
        self.replication: Replicator | None = None
        self.standby: Follower | None = None
        self._promotion = threading.Lock()
        self._replicate_as = replication
        for name in (r.tier for r in (replication, follow) if r is not None):
            if name not in store.tiers:
                raise InvalidRequest(f"replication tier {name!r} is not configured")
        if follow is not None:
            self._replicate_as = replication or ReplicationConfig(tier=follow.tier)
            store.writer.refuse(self._read_only)
            self.standby = Follower(store, store.tiers[follow.tier], follow, path)
        elif is_standby(path):
            raise Conflict(
                f"{path} is a standby's data dir: serve it with --follow, or promote "
                "it (ckpt promote) to make it a primary"
            )
        elif replication is not None:
            self._replicate(replication)

    def _replicate(self, config: ReplicationConfig) -> None:
        self.replication = Replicator(self._s, self._s.tiers[config.tier], config, self._path)
        self._s.writer.observe(self.replication)
        self._s.replica_barrier = self.replication.wait_restorable

    def _read_only(self) -> ReadOnlyStandby:
        tier = self.standby.config.tier if self.standby is not None else "?"
        return ReadOnlyStandby(
            f"this server is a read-only standby of the replica in tier {tier}: write to the "
            "primary, or promote this server (ckpt promote)"
        )

    @property
    def role(self) -> str:
        """`primary`, `standby` or `fenced` (see the module docstring)."""
        if self.standby is not None:
            return "standby"
        if self.replication is not None and self.replication.fenced_by is not None:
            return "fenced"
        return "primary"

    @property
    def writable(self) -> bool:
        return self._s.writer.refusal() is None

    def require_writable(self) -> None:
        """Raise what the writer would (`ReadOnlyStandby`, `Fenced`), before any work."""
        refusal = self._s.writer.refusal()
        if refusal is not None:
            raise refusal()

    def promote(self) -> Promotion:
        """Turn this standby into the primary: apply everything the replica has, claim the
        next epoch (fencing the old primary), replicate to the same tier under it, accept
        writes (vault/replication/follow.py, layout.py)."""
        with self._promotion:
            if self.standby is None or self._replicate_as is None:
                raise PromotionConflict(f"this server is not a standby (it is {self.role})")
            out = self.standby.promote()
            self.standby.close()
            self.standby = None
            self._s.take_over()
            self._replicate(self._replicate_as)
            self._s.writer.refuse(None)
        return replace(out, role=self.role)

    def step_down(self, error: Callable[[], Exception], timeout: float) -> bool:
        """Hand the replica over, planned (a cluster's shard moving to its standby): refuse
        changes from now on with `error()`, let those already queued commit, and wait until
        the replica has every one of them, so the standby's promotion loses nothing. False
        if that took longer than `timeout` (the refusal stays until `step_up`)."""
        self._s.writer.refuse(error)
        try:
            self._s.writer.submit(_nothing, replicated=True).result(timeout)
        except FutureTimeout:
            return False
        return self.replication is None or self.replication.wait_restorable(timeout)

    def step_up(self) -> None:
        """Take changes again after `step_down`, if this vault is still the primary."""
        if self.role == "primary":
            self._s.writer.refuse(None)

    def close(self) -> None:
        """Stop following; with replication, let the writer finish first so every commit
        is recorded before the replica's last ship."""
        if self.standby is not None:
            self.standby.close()
        if self.replication is not None:
            self._s.writer.close()
            self.replication.close()


def _nothing(w: WriteTxn) -> None:
    """A batch that changes nothing: once it committed, so had everything queued before."""
