"""Who is in the cluster: each process's beat in the store, and one observer's view of them.

Every process writes `members/<node>.<shard>.json` once per beat interval (a plain put: the
only writer of that key). A beat carries a sequence number; an observer counts a member
live while its sequence moved within `lease_ttl` by the observer's own monotonic clock,
never by comparing the member's clock with its own (Patroni's rule, docs/DESIGN.md). The
owner of a shard is its live primary at the highest epoch; epochs are claimed with a
conditional create (lease.py), so two primaries never share one.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from checkpoint_vault.vault.errors import ObjectNotFound
from checkpoint_vault.vault.tier import Tier

MEMBERS = "members/"


@dataclass(frozen=True)
class Member:
    node: str
    shard: int
    url: str
    role: str  # primary, standby or fenced
    epoch: int | None  # the replica epoch a primary writes under; None on a standby
    seq: int  # moves on every beat
    at: float  # the member's wall clock at the beat (shown, never compared)
    lag_seconds: float | None = None  # a primary's replica lag, a standby's behind it
    checkpoints: int | None = None  # its load: live checkpoints, logical and stored bytes
    logical_bytes: int | None = None
    stored_bytes: int | None = None
    s3_url: str | None = None  # its S3 endpoint, if on (config.py)

    @property
    def key(self) -> str:
        return f"{MEMBERS}{self.node}.{self.shard}.json"

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @staticmethod
    def decode(raw: bytes) -> Member:
        d: dict[str, Any] = json.loads(raw)
        return Member(
            node=str(d["node"]),
            shard=int(d["shard"]),
            url=str(d["url"]),
            role=str(d["role"]),
            epoch=None if d.get("epoch") is None else int(d["epoch"]),
            seq=int(d["seq"]),
            at=float(d["at"]),
            lag_seconds=None if d.get("lag_seconds") is None else float(d["lag_seconds"]),
            checkpoints=_int(d.get("checkpoints")),
            logical_bytes=_int(d.get("logical_bytes")),
            stored_bytes=_int(d.get("stored_bytes")),
            s3_url=None if d.get("s3_url") is None else str(d["s3_url"]),
        )


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass
class _Seen:
    member: Member
    changed: float  # observer's monotonic time when its seq last moved


class Roster:
    """One process's view of the members, refreshed from the store."""

    def __init__(self, ttl: float) -> None:
        self._ttl = ttl
        self._seen: dict[str, _Seen] = {}

    def refresh(self, tier: Tier) -> None:
        """Read every member's beat (blocking). A member whose beat is gone is forgotten."""
        now = time.monotonic()
        keys = list(tier.list(MEMBERS))
        seen: dict[str, _Seen] = {}
        for key in keys:
            try:
                member = Member.decode(tier.get(key))
            except (ObjectNotFound, ValueError, KeyError, TypeError):
                continue  # removed meanwhile, or not a beat: not a member
            old = self._seen.get(key)
            if old is not None and old.member.seq == member.seq:
                seen[key] = _Seen(member, old.changed)
            else:
                seen[key] = _Seen(member, now)
        self._seen = seen

    def note(self, member: Member) -> None:
        """This process's own beat, seen as soon as it is written."""
        self._seen[member.key] = _Seen(member, time.monotonic())

    def members(self) -> list[tuple[Member, bool, float]]:
        """Every member, whether it is live, and seconds since its beat last moved."""
        now = time.monotonic()
        out = []
        for s in sorted(self._seen.values(), key=lambda s: (s.member.shard, s.member.node)):
            age = now - s.changed
            out.append((s.member, age < self._ttl, round(age, 3)))
        return out

    def owner(self, shard: int) -> Member | None:
        """The live primary of `shard` at the highest epoch, or None."""
        best: Member | None = None
        for member, live, _ in self.members():
            if member.shard != shard or member.role != "primary" or not live:
                continue
            if best is None or (member.epoch or 0) > (best.epoch or 0):
                best = member
        return best
