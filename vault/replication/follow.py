"""A read-only standby: a vault that follows a replica and can be promoted to its primary.

`ckpt serve --follow replica:NAME` opens the data dir as a standby: its writer refuses every
change but the follower's (`ReadOnlyStandby`), and the `Follower` keeps it at the replica.

- Start: the replica is rebuilt from its base and log in a scratch dir and converged onto
  the data dir (an empty one the first time), before the service answers.
- Follow: every `poll_interval` (0.25 s) it fetches the next segments of the generation it
  follows and applies them (vault/replication/apply.py: readers only ever see states the
  primary had). A poll that finds no new segment also asks whether the replica moved on:
  a newer epoch (a promotion), a new generation (the primary restarted after a crash, or
  dropped its backlog), or a base past the segments still kept (the standby was away long):
  it then rebuilds and converges onto that, which is one catalog transaction too.
- Chunk bytes: hot frames come with the log (frame records first, as on the primary) into
  the standby's own frame environment; packed chunks are read from the tier, as on the
  primary, since the catalog it follows names the same packs. The primary deletes a pack
  only after the replica has passed the change that stopped naming it; a standby that has
  not applied that change yet answers 503 for such a chunk, and the next read, after the
  next poll, finds it where it moved.
- Crash safety: `standby.json` in the vault dir holds the position (epoch, generation, next
  segment), rewritten after each applied group; before a group it is marked as under way,
  and a start that finds the mark rebuilds instead of trusting a state that may lie between
  two of the primary's.
- Promotion (`promote`): catch up, claim the next epoch (its fence), catch up again (rule 1
  of layout.py: every acknowledged commit is now in the replica), name the fence point, and
  hand back; the vault then starts replicating under the new epoch and accepts writes.
- Lag: `lag_seconds` is how long ago the standby last held everything the replica held
  (the time of its last poll that found nothing newer); `apply_lag` samples the time from
  a batch's commit on the primary to its application here (two machines' clocks).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from checkpoint_vault.protocol import Promotion, StandbyStatus

from ..errors import PromotionConflict, ReplicaNotFound
from ..ownership import open_private
from ..tier import Tier
from .apply import ApplyParts, apply_run, converge, frame_runs
from .changes import decode_batches
from .layout import (
    Current,
    claim_epoch,
    newest_epoch,
    read_current,
    write_current,
    write_local_epoch,
)
from .restore import GROUP_BYTES, build, open_envs, segments
from .shipper import LAG_SAMPLES, RESUME, quantile

if TYPE_CHECKING:
    from ..runtime import Runtime
    from ..seal import Keyring


class FollowParts(ApplyParts, Protocol):
    """What following a primary needs of the store: applying its log (`ApplyParts`), the
    keyring that opens it, and the runtime's threads that fetch it."""

    @property
    def keyring(self) -> Keyring | None: ...
    @property
    def runtime(self) -> Runtime: ...


log = logging.getLogger(__name__)

POSITION = "standby.json"  # in the vault dir: what the standby holds (see above)
SCRATCH = ".follow-"  # prefix of the scratch dirs replicas are rebuilt in


@dataclass(frozen=True)
class FollowConfig:
    tier: str  # the configured tier whose replica to follow
    poll_interval: float = 0.25  # seconds between polls of the object store


@dataclass(frozen=True)
class Position:
    tier: str
    epoch: int  # the epoch whose `current` the standby follows
    generation: str
    next_segment: int
    applying: bool = False  # a change was under way: the state may be half of one


def read_position(vault_dir: Path) -> Position | None:
    try:
        return Position(**json.loads((vault_dir / POSITION).read_text()))
    except FileNotFoundError:
        return None


def is_standby(vault_dir: Path) -> bool:
    """Whether the data dir is a standby's (promotion is the only way to a primary)."""
    return (vault_dir / POSITION).exists()


def _write_position(vault_dir: Path, pos: Position) -> None:
    tmp = vault_dir / (POSITION + ".partial")
    with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as f:
        f.write(json.dumps(asdict(pos)))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, vault_dir / POSITION)


class Follower:
    """Keeps a standby's vault at the replica in `tier` (see the module docstring)."""

    def __init__(
        self, store: FollowParts, tier: Tier, config: FollowConfig, vault_dir: Path
    ) -> None:
        """Catches up before returning; raises `ReplicaNotFound` (or the tier's error) only
        when there is no consistent state to serve: never synced, or interrupted mid-way."""
        self._s = store
        self._tier = tier
        self.config = config
        self._dir = vault_dir
        self._lock = threading.Lock()  # one change at a time (the poll thread, promote)
        self._stop = threading.Event()
        self._watchers: list[Callable[[set[str]], None]] = []
        self._pos = read_position(vault_dir)
        if self._pos is not None and self._pos.tier != tier.name:
            self._pos = None
        self._current: Current | None = None  # the pointer followed (read at each start)
        # (epoch followed, epoch claimed) by this process's promotion, for a retry
        self._claimed: tuple[int, int] | None = None
        self.state = "starting"
        self.caught_up_at: float | None = None
        self.applied_through: float | None = None  # commit time of the last batch applied
        self._lags: deque[float] = deque(maxlen=LAG_SAMPLES)
        self.segments = self.batches = self.rebases = self.polls = self.failures = 0
        self.last_error: str | None = None
        (vault_dir / RESUME).unlink(missing_ok=True)  # a primary's: never continued from here
        for old in vault_dir.glob(SCRATCH + "*"):
            shutil.rmtree(old, ignore_errors=True)
        try:
            while self.poll():
                pass
        except Exception as e:
            if self._pos is None or self._pos.applying:
                raise
            self._failed(e)  # serve what is here (consistent); the thread keeps trying
        if self._pos is None or self._pos.applying:  # a promotion has not named its replica
            raise ReplicaNotFound(f"the replica in tier {tier.name} is being promoted; retry")
        self._thread = store.runtime.thread("vault-standby", self._loop)

    def watch(self, fn: Callable[[set[str]], None]) -> None:
        """Call `fn(catalog databases changed)` from the follower's thread after each change
        (the service reloads its token cache when `tokens` is among them)."""
        self._watchers.append(fn)

    # -- following -----------------------------------------------------------------------
    def _loop(self) -> None:
        more = False
        while not self._stop.wait(0 if more else self.config.poll_interval):
            try:
                more = self.poll()
            except Exception as e:  # noqa: BLE001 - the store is down or failing: next poll
                more = False
                self._failed(e)

    def _failed(self, e: Exception) -> None:
        self.failures += 1
        self.last_error = f"{type(e).__name__}: {e}"[:300]
        log.warning("standby: following %s failed: %s", self.config.tier, self.last_error)

    def poll(self) -> bool:
        """One round; True when there is more to apply at once (a group was cut short)."""
        with self._lock:
            self.polls += 1
            return self._poll()

    def _poll(self) -> bool:
        if self._pos is None or self._pos.applying or self._current is None:
            fresh = self._locate()
            if fresh is None:
                return False
            self._adopt(fresh)
        assert self._current is not None
        probed = time.time()
        applied, more = self._apply_log(self._current)
        if applied:
            return more
        fresh = self._locate()  # nothing new in this generation: has the replica moved?
        if fresh is not None:
            self._adopt(fresh, probed)
        return False

    def _locate(self) -> Current | None:
        """The pointer to follow: the newest epoch's, or None while a promotion that
        claimed it has not named its replica yet (then the standby stays where it is)."""
        known = self._pos.epoch if self._pos is not None else 0
        epoch = newest_epoch(self._tier, known)
        current = read_current(self._tier, epoch)
        if current is None and epoch == 0:
            raise ReplicaNotFound(f"tier {self._tier.name} holds no replica (no base finished)")
        if current is None:
            self.state = f"waiting for the promotion to epoch {epoch}"
        return current

    def _adopt(self, fresh: Current, probed: float | None = None) -> None:
        """Follow `fresh`: in the same generation's log, or rebuilt from its base."""
        pos = self._pos
        same_log = (
            pos is not None
            and not pos.applying
            and pos.generation == fresh.generation
            and fresh.base_segment <= pos.next_segment
            and (fresh.end_segment is None or pos.next_segment <= fresh.end_segment)
        )
        if same_log and pos is not None:
            self._current = fresh
            if pos.epoch != fresh.epoch:
                self._set_position(replace(pos, epoch=fresh.epoch))
            self.state = "following"
            if probed is not None:
                self.caught_up_at = probed
        else:
            self._rebase(fresh)

    def _apply_log(self, target: Current) -> tuple[int, bool]:
        """Apply the segments after the position, up to GROUP_BYTES of log; returns how
        many were applied and whether more may be waiting."""
        pos = self._pos
        assert pos is not None
        batches = []
        size, last = 0, None
        fetch = self._s.runtime.fetch
        for seq, body in segments(self._tier, target, pos.next_segment, self._s.keyring, fetch, 1):
            batches += list(decode_batches(body))
            size, last = size + len(body), seq
            if size >= GROUP_BYTES:
                break
        if last is None:
            return 0, False
        self._set_position(replace(pos, applying=True))
        touched: set[str] = set()
        for run in frame_runs(batches):
            touched |= apply_run(self._s, run)
        now = time.time()
        for b in batches:
            self._lags.append(now - b.committed_at)
        self.applied_through = batches[-1].committed_at if batches else self.applied_through
        self.segments += last - pos.next_segment + 1
        self.batches += len(batches)
        self._set_position(replace(pos, next_segment=last + 1, applying=False))
        self._notify(touched)
        return last - pos.next_segment + 1, size >= GROUP_BYTES

    def _rebase(self, target: Current) -> None:
        """Rebuild `target`'s replica in a scratch dir and converge the vault onto it."""
        started = time.monotonic()
        with tempfile.TemporaryDirectory(dir=self._dir, prefix=SCRATCH) as tmp:
            built = build(
                self._tier, target, self._s.keyring, None, Path(tmp), self._s.runtime.fetch
            )
            if self._pos is not None:
                self._set_position(replace(self._pos, applying=True))
            catalog, frames = open_envs(Path(tmp))
            try:
                changed = converge(self._s, catalog, frames)
            finally:
                catalog.close()
                frames.close()
        self._current = target
        self.rebases += 1
        self.applied_through = built.last or self.applied_through
        self.caught_up_at = time.time()
        self.state = "following"
        self._set_position(
            Position(self._tier.name, target.epoch, target.generation, built.next_segment)
        )
        log.info(
            "standby: rebuilt from %s@%d (epoch %d): %d keys changed, %.2f s",
            target.generation,
            target.base_segment,
            target.epoch,
            changed,
            time.monotonic() - started,
        )
        self._notify({"*"})

    def _set_position(self, pos: Position) -> None:
        _write_position(self._dir, pos)
        self._pos = pos

    def _notify(self, touched: set[str]) -> None:
        for fn in self._watchers:
            try:
                fn(touched)
            except Exception:  # noqa: BLE001 - a watcher's trouble is not the follower's
                log.exception("standby watcher failed")

    # -- promotion -----------------------------------------------------------------------
    def promote(self) -> Promotion:
        """Make the replica's newest state this vault's and claim the next epoch (see the
        module docstring). The caller then starts replicating under it (the epoch file
        names it) and accepts writes. On failure the standby goes on following."""
        self._stop.set()
        self._thread.join()
        started = time.monotonic()
        try:
            with self._lock:
                out = self._promote()
        except BaseException:
            self._stop.clear()
            self._thread = self._s.runtime.thread("vault-standby", self._loop)
            raise
        epoch, generation, fence = out
        return Promotion(epoch, generation, fence, round(time.monotonic() - started, 3))

    def _promote(self) -> tuple[int, str, int]:
        """Claim the epoch and take over; returns (epoch, generation, fence segment)."""
        known = self._pos.epoch if self._pos is not None else 0
        if self._claimed is None or newest_epoch(self._tier, known) != self._claimed[1]:
            while self._poll():  # not a retry of this process's own claim: catch up first
                pass
            target = self._current
            if target is None:
                raise PromotionConflict("this standby holds no replica yet")
            # Past any epoch claimed by a promotion that never named its replica (its
            # server died mid-way): the last promotion wins, and the epoch before it fences
            # every older primary, this one's old primary included (layout.py, rule 2).
            epoch = newest_epoch(self._tier, target.epoch) + 1
            claim_epoch(self._tier, epoch, target)
            self._claimed = (target.epoch, epoch)
        old, epoch = self._claimed
        # Rule 1: whatever was acknowledged under the old epoch is in its replica now.
        fresh = read_current(self._tier, old)
        if fresh is None:
            raise ReplicaNotFound(f"tier {self._tier.name} lost epoch {old}'s replica")
        self._adopt(fresh)
        while self._apply_log(fresh)[0]:
            pass
        pos = self._pos
        assert pos is not None
        end = pos.next_segment
        write_current(
            self._tier, Current(epoch, pos.generation, fresh.base_segment, fresh.base_batch, end)
        )
        write_local_epoch(self._dir, epoch)
        (self._dir / POSITION).unlink()
        self.state = "promoted"
        return epoch, pos.generation, end

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    # -- observers -----------------------------------------------------------------------
    def status(self) -> StandbyStatus:
        pos = self._pos
        lags = sorted(list(self._lags))
        return StandbyStatus(
            tier=self.config.tier,
            state=self.state,
            epoch=pos.epoch if pos else None,
            generation=pos.generation if pos else None,
            next_segment=pos.next_segment if pos else None,
            poll_interval=self.config.poll_interval,
            lag_seconds=(
                round(max(0.0, time.time() - self.caught_up_at), 3)
                if self.caught_up_at is not None
                else None
            ),
            applied_through=self.applied_through,
            apply_lag_p50=quantile(lags, 0.5),
            apply_lag_p99=quantile(lags, 0.99),
            segments=self.segments,
            batches=self.batches,
            rebases=self.rebases,
            polls=self.polls,
            failures=self.failures,
            last_error=self.last_error,
        )
