"""One process's part in the cluster: its beat, its lease, its view of the others.

`ClusterNode` does blocking store calls only; api/cluster/context.py runs `beat` on a thread once
per beat interval and asks `route` on every request. What it needs of the vault comes as
a `Local` snapshot each beat (role, epoch, lag), so nothing here reaches into the engine.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from checkpoint_vault.vault.errors import TierError
from checkpoint_vault.vault.tier import Tier

from . import lease
from .config import ClusterConfig
from .errors import ClusterConflict, NotOwner
from .members import Member, Roster
from .shards import shard_of
from .tokens import TokenMirror, TokenTable

log = logging.getLogger("ckpt.cluster")

# Seconds a standby leaves a shard whose owner released it (`ckpt cluster move`) to the
# move's own promotion, before taking it over as if the owner were gone (the move died).
RELEASE_GRACE = 30.0


@dataclass(frozen=True)
class Local:
    """This process as its vault describes it at a beat."""

    role: str  # primary, standby, fenced (vault.roles.role)
    epoch: int | None  # the replica epoch it writes under (None: a standby)
    lag_seconds: float | None
    checkpoints: int | None = None  # its load, from the catalog's counters
    logical_bytes: int | None = None
    stored_bytes: int | None = None


class ClusterNode:
    def __init__(
        self, config: ClusterConfig, tier: Tier, tokens: TokenTable | None, *, beats: bool = True
    ) -> None:
        """`tier`: the cluster's objects (`config.store`); `tokens`: the vault's table, on
        a process that writes (a primary mirrors tokens, a standby gets its primary's).
        `beats`: False in a process that only reads (a worker): it watches the members
        and counts its shard owned while its writing process's beat says so."""
        self.config = config
        self._beats = beats
        self.forwarded = 0  # requests this process passed on to another shard's owner
        self.takeovers: list[float] = []  # seconds each promotion of this process took
        self._tier = tier
        self.roster = Roster(config.lease_ttl)
        self._mirror = TokenMirror(tier, tokens) if tokens is not None else None
        self._seq = 0
        self._held: lease.Lease | None = None
        self.lost: ClusterConflict | None = None  # set once another holds our shard
        self.last_beat: float | None = None  # monotonic time a written beat was started
        self.local: Local | None = None  # the vault as the last beat saw it
        self.released = False  # handed its shard over (a move): forwards, never 409s
        self._owner_seen: float | None = None  # when this standby last saw a live owner
        self._released_seen: float | None = None  # when it first saw the owner release

    @property
    def shard(self) -> int:
        return self.config.shard

    @property
    def store(self) -> Tier:
        """The cluster's objects (`config.store`): for the release markers of parts
        (releases.py), which the api writes and reads outside the beat."""
        return self._tier

    def shard_of(self, namespace: str) -> int:
        return shard_of(namespace, self.config.shards)

    def live_owner(self, shard: int) -> Member:
        """The live owner of `shard` another process may ask; `NotOwner` while there is
        none (or the roster still names this process, which does not own it)."""
        owner = self.roster.owner(shard)
        if owner is None or owner.url == self.config.url:
            raise NotOwner(f"shard {shard} has no live owner right now; retry shortly")
        return owner

    @property
    def fenced(self) -> bool:
        """Whether this process lost its shard without handing it over: another holds its
        lease, or its replica was taken over (its vault refuses writes, `Fenced`)."""
        if self.released:
            return False
        return self.lost is not None or (self.local is not None and self.local.role == "fenced")

    def owns(self) -> bool:
        """Whether this process writes its shard now: it holds the lease of its epoch, has
        heard of no newer one, and its last beat started less than the lease's TTL minus
        one beat interval ago. Observers time the TTL from when they saw that beat, which
        is after it started: so this process stops before any observer counts it gone."""
        if not self._beats:
            owner = self.roster.owner(self.config.shard)
            return owner is not None and owner.url == self.config.url
        if self.released:
            return False
        if self._held is None or self.lost is not None or self.last_beat is None:
            return False
        margin = self.config.lease_ttl - self.config.beat_interval
        return time.monotonic() - self.last_beat < margin

    def beat(self, local: Local) -> bool:
        """One beat (blocking): claim or check the lease, publish the beat, read the others,
        mirror tokens. Returns whether the token table changed. Store errors are logged and
        leave the previous view: the lease lapses by itself if they last."""
        if not self._beats:
            try:
                self.roster.refresh(self._tier)
            except TierError as e:
                log.warning("cluster view not refreshed: %s", e)
            return False
        self.local = local
        try:
            if local.role == "primary" and self.lost is None and not self.released:
                self._hold(local.epoch or 0)
            self._seq += 1
            started = time.monotonic()
            me = Member(
                node=self.config.node,
                shard=self.config.shard,
                url=self.config.url,
                role=self._role(local),
                epoch=local.epoch,
                seq=self._seq,
                at=time.time(),
                lag_seconds=local.lag_seconds,
                checkpoints=local.checkpoints,
                logical_bytes=local.logical_bytes,
                stored_bytes=local.stored_bytes,
                s3_url=self.config.s3_url or None,
            )
            self._tier.put(me.key, me.encode())
            if self.lost is None and local.role == "primary" and self._held is not None:
                self.last_beat = started
            self.roster.refresh(self._tier)
            self.roster.note(me)
            if self._mirror is not None and self.owns():
                return self._mirror.sync()
        except TierError as e:
            log.warning("cluster beat failed: %s", e)
        return False

    def takeover_due(self) -> bool:
        """Whether this standby should promote itself now: it saw its shard's owner live
        once (never at a cold start, when the primary may just be slower to come up), no
        live owner is left (no beat moved for the lease's TTL, by this process's clock),
        and it is the first by name of the shard's live standbys (so one promotes). An
        owner that released the shard for a move is left to the move for a while."""
        if self.local is None or self.local.role != "standby":
            return False
        now = time.monotonic()
        if self.roster.owner(self.config.shard) is not None:
            self._owner_seen = now
            self._released_seen = None
            return False
        if self._owner_seen is None:
            return False
        if self._releasing():  # a planned move promotes its own target
            self._released_seen = self._released_seen or now
            if now - self._released_seen < RELEASE_GRACE:
                return False
        standbys = [
            m.node
            for m, live, _ in self.roster.members()
            if m.shard == self.config.shard and m.role == "standby" and live
        ]
        return min(standbys, default=None) == self.config.node

    def _releasing(self) -> bool:
        return any(
            m.shard == self.config.shard and m.role == "released" and live
            for m, live, _ in self.roster.members()
        )

    def _hold(self, epoch: int) -> None:
        want = lease.Lease(self.config.shard, epoch, self.config.node, self.config.url)
        try:
            if self._held != want:
                lease.claim(self._tier, want)
                self._held = want
                log.info("holding shard %d at epoch %d", want.shard, epoch)
            else:
                lease.check(self._tier, want)
        except ClusterConflict as e:
            self.lost = e
            log.error("%s", e.message)

    def _role(self, local: Local) -> str:
        if self.released and local.role != "standby":
            return "released"
        if local.role == "primary" and self.lost is not None:
            return "fenced"
        return local.role

    def status(self) -> dict[str, Any]:
        """The cluster as this process sees it (GET /v1/cluster)."""
        members = self.roster.members()
        nodes: dict[str, dict[str, Any]] = {}
        for m, live, age in members:
            n = nodes.setdefault(
                m.node, {"node": m.node, "up": False, "processes": 0, "owns": [], "checkpoints": 0}
            )
            n["processes"] += 1
            n["up"] = n["up"] or live
            n["beat_age_seconds"] = min(age, n.get("beat_age_seconds", age))
        shards = []
        owners = []
        for k in range(self.config.shards):
            owner = self.roster.owner(k)
            if owner is not None:
                owners.append(owner)
            if owner is not None:
                nodes[owner.node]["owns"].append(k)
                nodes[owner.node]["checkpoints"] += owner.checkpoints or 0
            shards.append(
                {
                    "shard": k,
                    "owner": owner.node if owner else None,
                    "url": owner.url if owner else None,
                    "epoch": owner.epoch if owner else None,
                    "lag_seconds": owner.lag_seconds if owner else None,
                    "checkpoints": owner.checkpoints if owner else None,
                    "logical_bytes": owner.logical_bytes if owner else None,
                    "stored_bytes": owner.stored_bytes if owner else None,
                    "standbys": [
                        m.node
                        for m, live, _ in members
                        if m.shard == k and m.role == "standby" and live
                    ],
                }
            )
        return {
            "node": self.config.node,
            "shard": self.config.shard,
            "shards": self.config.shards,
            "lease_ttl": self.config.lease_ttl,
            "forwarded": self.forwarded,
            "takeovers": self.takeovers,
            "nodes": sorted(nodes.values(), key=lambda n: str(n["node"])),
            "members": [
                {
                    "node": m.node,
                    "shard": m.shard,
                    "url": m.url,
                    "s3_url": m.s3_url,
                    "role": m.role,
                    "epoch": m.epoch,
                    "live": live,
                    "beat_age_seconds": age,
                    "lag_seconds": m.lag_seconds,
                }
                for m, live, age in members
            ],
            "shard_owners": shards,
            "totals": {  # the owners' figures: the whole while every shard has one
                "checkpoints": sum(o.checkpoints or 0 for o in owners),
                "logical_bytes": sum(o.logical_bytes or 0 for o in owners),
                "stored_bytes": sum(o.stored_bytes or 0 for o in owners),
            },
        }
