"""Where the replica's objects live in the tier, which of them is the replica, and epochs.

Layout (every object but the fences and `current` pointers is sealed with the keyring when
one is configured):

    replica/fence/<E:06d>                   epoch E >= 1 exists: written once, if absent
    replica/current                         the replica of epoch 0 (no promotion yet)
    replica/e<E:06d>/current                the replica of epoch E >= 1
    replica/<G>/base-<n:012d>-<env>         generation G's base copy at segment n
    replica/<G>/log/<n:012d>.seg            segment n of generation G

A generation G is named `g<time>-<hex>` in epoch 0 and `e<E:06d>/g<time>-<hex>` in epoch E,
so every key a writer of epoch E creates carries its epoch, and no reader that follows a
newer epoch ever reads it. A `current` pointer is {"generation", "base_segment",
"base_batch"}, plus "end_segment" when it names a generation of the previous epoch up to
the fence point (below).

Fencing. One primary writes a prefix at a time, at an epoch: 0 until a standby is first
promoted, then whatever the data dir's `replica.epoch` file says (absent: 0). A promotion
to epoch E+1 creates `replica/fence/<E+1>` with a conditional put, then catches up with
epoch E's replica (its generation up to the first missing segment n), then writes
`replica/e<E+1>/current` naming that generation with "end_segment" n; the new primary's own
generation replaces it once its base is complete. The rules that make this safe:

1. A primary of epoch E counts a write restorable (acknowledges a sync commit, reports its
   lag as 0) only after checking, once the write (segment or `current`) is in the store,
   that `replica/fence/<E+1>` does not exist. So everything acknowledged under epoch E was
   in the store before the fence, and the promotion, which reads epoch E's replica after
   writing the fence, has it.
2. A primary that finds the fence stops shipping and refuses writes (`Fenced`), for good;
   one that starts and finds it (the old primary coming back) never takes a write.
3. Readers (a restore, a standby) follow the newest epoch that has a `current`, and replay
   its generation from the base up to the first missing segment or "end_segment",
   whichever is first. A segment the old primary put after the fence (at most the one in
   flight when it was written: each next one waits for the previous put and its check) is
   at or past the end and never read; anything else it writes is under an older epoch's
   `current` or generation, which nothing follows any more.
4. Epochs are claimed one after another (a promotion claims the newest existing + 1, by
   conditional put: of two racing for one, one wins), so "a newer epoch exists" is one HEAD
   of the next fence. A promotion goes past an epoch whose claimant never named its
   replica (it died): rule 2 already fenced the primaries before it. Fences are never
   deleted; the rest of older epochs goes once the newest epoch's base is current.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ObjectExists, ObjectNotFound, PromotionConflict, ReplicaNotFound
from ..files import fsync_dir
from ..ownership import open_private
from ..tier import Tier

PREFIX = "replica/"
FENCES = PREFIX + "fence/"
LEGACY_CURRENT = PREFIX + "current"  # epoch 0's pointer, where replicas before epochs had it
EPOCH_FILE = "replica.epoch"  # in the vault dir: the epoch this data dir writes under


def fence_key(epoch: int) -> str:
    return f"{FENCES}{epoch:06d}"


def epoch_prefix(epoch: int) -> str:
    """Where epoch `epoch`'s own objects live (epoch 0: beside the fences, as before)."""
    return PREFIX if epoch == 0 else f"{PREFIX}e{epoch:06d}/"


def current_key(epoch: int) -> str:
    return LEGACY_CURRENT if epoch == 0 else epoch_prefix(epoch) + "current"


def new_generation(epoch: int) -> str:
    name = time.strftime("g%Y%m%dt%H%M%S", time.gmtime()) + "-" + secrets.token_hex(4)
    return name if epoch == 0 else f"e{epoch:06d}/{name}"


def generation_key(gen: str, name: str) -> str:
    return f"{PREFIX}{gen}/{name}"


def base_key(gen: str, seq: int, env: str) -> str:
    return generation_key(gen, f"base-{seq:012d}-{env}")


def segment_key(gen: str, seq: int) -> str:
    return generation_key(gen, f"log/{seq:012d}.seg")


def epoch_of(key: str) -> int | None:
    """The epoch whose writer made `key` (None: a fence, which belongs to no writer)."""
    rest = key[len(PREFIX) :]
    if rest.startswith("fence/"):
        return None
    head = rest.split("/", 1)[0]
    if len(head) == 7 and head[0] == "e" and head[1:].isdigit():
        return int(head[1:])
    return 0


@dataclass(frozen=True)
class Current:
    """What an epoch's `current` names: a generation's base and how far to replay its log."""

    epoch: int  # the epoch whose pointer this is (not necessarily the generation's)
    generation: str
    base_segment: int
    base_batch: int = 0
    end_segment: int | None = None  # replay stops before this segment: the fence point

    def encode(self) -> bytes:
        body: dict[str, Any] = {
            "generation": self.generation,
            "base_segment": self.base_segment,
            "base_batch": self.base_batch,
            "created_at": time.time(),
        }
        if self.end_segment is not None:
            body["end_segment"] = self.end_segment
        return json.dumps(body).encode()

    def within(self, seq: int) -> bool:
        """Whether segment `seq` belongs to what this pointer names (before the end)."""
        return self.end_segment is None or seq < self.end_segment


def read_current(tier: Tier, epoch: int) -> Current | None:
    try:
        raw = json.loads(tier.get(current_key(epoch)))
    except ObjectNotFound:
        return None
    end = raw.get("end_segment")
    return Current(
        epoch,
        str(raw["generation"]),
        int(raw["base_segment"]),
        int(raw.get("base_batch", 0)),
        int(end) if end is not None else None,
    )


def write_current(tier: Tier, current: Current) -> None:
    tier.put(current_key(current.epoch), current.encode())


def newest_epoch(tier: Tier, known: int = 0) -> int:
    """The newest epoch claimed in `tier`, probing the fences after `known` (they are
    claimed one after another, so the first missing one ends the search)."""
    epoch = known
    while tier.head(fence_key(epoch + 1)) is not None:
        epoch += 1
    return epoch


def fenced_past(tier: Tier, epoch: int) -> bool:
    """Whether a newer epoch than `epoch` has been claimed (one HEAD)."""
    return tier.head(fence_key(epoch + 1)) is not None


def claim_epoch(tier: Tier, epoch: int, after: Current | None) -> None:
    """Create epoch `epoch`'s fence, or raise `PromotionConflict` if someone else did."""
    body = {
        "epoch": epoch,
        "claimed_at": time.time(),
        "after": after.generation if after is not None else None,
        "host": os.uname().nodename,
        "pid": os.getpid(),
    }
    try:
        tier.put(fence_key(epoch), json.dumps(body).encode(), if_absent=True)
    except ObjectExists:
        raise PromotionConflict(
            f"epoch {epoch} of the replica in tier {tier.name} was claimed by another "
            "promotion; this server stays a standby"
        ) from None


def replica_current(tier: Tier) -> Current:
    """The replica a restore rebuilds: the newest epoch's `current`, or, while a promotion
    has claimed an epoch but not yet named its replica, the newest one before it."""
    for epoch in range(newest_epoch(tier), -1, -1):
        current = read_current(tier, epoch)
        if current is not None:
            return current
    raise ReplicaNotFound(f"tier {tier.name} holds no replica (no base finished)")


def read_local_epoch(vault_dir: Path) -> int:
    """The epoch this data dir writes under (0 when it never was promoted or restored
    from a promoted replica)."""
    try:
        return int(json.loads((vault_dir / EPOCH_FILE).read_text())["epoch"])
    except FileNotFoundError:
        return 0


def write_local_epoch(vault_dir: Path, epoch: int) -> None:
    """Durably, before anything is written under the new epoch."""
    tmp = vault_dir / (EPOCH_FILE + ".partial")
    with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as f:
        f.write(json.dumps({"epoch": epoch}))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, vault_dir / EPOCH_FILE)
    fsync_dir(vault_dir)
