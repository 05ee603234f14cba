"""Continuous replication of the vault to an object-store tier (issue 15).

The writer thread hands every committed batch's changes (vault/replication/changes.py) to
the `Replicator`, which queues them in memory and ships them from its own thread, in commit
order, as segments: one object per upload holding every batch queued since the previous
one, so uploads group the way the writer's commits do. A generation is a base copy (the
catalog and the frame environment, each a compacted LMDB copy) plus the log of segments
after it; the replica is the generation `replica/current` names.

The objects' keys, epochs and the fencing rules are in vault/replication/layout.py; bases
are zstd of compacted LMDB copies, segments zstd of the batches, in order.

Invariant: what a restore replays is always a prefix of the primary's committed history
ending on a batch boundary, so the replica never names a chunk it does not have.
- Segments are uploaded one at a time in order; segment k+1 is put only after segment k's
  put returned, and restore stops at the first missing number.
- A batch is in one segment whole (its frame records before its catalog records), and a
  restore applies a segment's frames before its catalog, as the writer commits them.
- A base is a fuzzy copy taken after its generation began: it holds every batch before the
  generation and some after. Log records are blind writes (final values, deletes, drops),
  so replaying the generation's whole log over it ends exactly where the primary's log
  ends. `replica/current` moves to a generation only after its base is complete; until
  then the previous generation (a complete prefix) is the replica.
- Packs leave the tier only after the replica has passed the commit that stopped naming
  them (`wait_restorable`, used by pack deletion), so no replica names a deleted pack.

A start continues the current generation only when the data dir says it may: a clean close
(everything shipped) and a restore from the replica leave `replica.resume` naming the
generation, the next segment number and both environments' LMDB transaction ids; the start
takes the file away, and continues only if the ids still match (nothing wrote in between)
and the tier's `replica/current` still names that generation. Any other start (after a
SIGKILL the local queue, kept in memory, is gone) begins a new generation with a new base.
Segments are created with `if_absent`: if one exists already, another writer has the
generation, and this one leaves it for a new generation of its own. A primary finds out it
was fenced (a standby promoted past its epoch) by checking after every put; from then on it
ships nothing and its writer refuses changes (layout.py, "Fencing"). An overflow too: past
`max_backlog` bytes queued (the store down for long), the queue is dropped and a new
generation begins; producers never wait for the store in async mode. In sync mode a commit
is acknowledged when the segment (or base) holding it is in the replica, so producers do
wait for the store.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import zstandard

from checkpoint_vault.protocol import ReplicationStatus

from ..env import CATALOG_DBS, FRAME_DBS, Env
from ..errors import Fenced, ObjectExists
from ..tier import Tier
from ..writer import WriteTxn
from .changes import CATALOG, FRAMES, BatchLog, Recording, RecordingTxn
from .layout import (
    PREFIX,
    Current,
    base_key,
    current_key,
    epoch_of,
    fenced_past,
    generation_key,
    new_generation,
    read_current,
    read_local_epoch,
    segment_key,
    write_current,
)
from .rebase import rebase_due

if TYPE_CHECKING:
    from ..env import Env
    from ..runtime import Runtime
    from ..seal import Keyring
    from ..writer import Writer


class ShipperParts(Protocol):
    """What shipping the log needs of the store."""

    @property
    def catalog_env(self) -> Env: ...
    @property
    def frames_env(self) -> Env: ...
    @property
    def keyring(self) -> Keyring | None: ...
    @property
    def runtime(self) -> Runtime: ...
    @property
    def writer(self) -> Writer: ...


log = logging.getLogger(__name__)

RESUME = "replica.resume"  # in the vault dir: where a start may continue (see above)
FORGET_STEP = 20  # old generations' objects deleted per idle turn of the shipping thread
REBASE_CHECK = 1.0  # seconds between two looks at the replica's dead bytes (rebase.py)
SEGMENT_CONTEXT = b"ckpt replica segment"
BASE_CONTEXT = b"ckpt replica base"
MODES = ("async", "sync")
RETRY_MIN, RETRY_MAX = 0.05, 1.0  # seconds between attempts while the store fails
LAG_SAMPLES = 10_000  # recent per-batch lags kept for the percentiles


@dataclass(frozen=True)
class ReplicationConfig:
    tier: str  # a configured tier name: where the replica lives
    mode: str = "async"  # "async": ack when durable locally; "sync": when in the replica
    lag_budget: float = 2.0  # seconds; what async promises (reported, not enforced)
    max_backlog: int = 1 << 30  # bytes queued before the queue is dropped for a new base
    base_interval: float = 3600.0  # seconds between base copies (bounds restore's replay)
    base_after_bytes: int = 4 << 30  # or this much log since the last base, whichever first


@dataclass
class _Queued:
    batch: int
    committed_at: float
    body: bytes


class Replicator:
    """Records the writer's changes and ships them (see the module docstring)."""

    def __init__(
        self, store: ShipperParts, tier: Tier, config: ReplicationConfig, scratch: Path
    ) -> None:
        """`scratch`: a directory on the vault's file system for base copies."""
        if config.mode not in MODES:
            raise ValueError(f"replication mode must be one of {MODES}")
        self._s = store
        self._tier = tier
        self._scratch = scratch
        self.config = config
        self._dbs = {
            CATALOG: {id(store.catalog_env.db[n.decode()]): i for i, n in enumerate(CATALOG_DBS)},
            FRAMES: {id(store.frames_env.db[n.decode()]): i for i, n in enumerate(FRAME_DBS)},
        }
        self._cond = threading.Condition()
        self._queue: deque[_Queued] = deque()  # recorded, not yet in a segment
        self._queued_bytes = 0
        self._batch = 0  # batches recorded so far (numbers start at 1)
        # Recorded, not yet restorable: (batch, commit time, sync ack or None), in order.
        self._pending: deque[tuple[int, float, Future[None] | None]] = deque()
        self._restorable = 0  # every batch up to this number is in the replica
        self._shipped = 0  # highest batch in a segment of the current generation
        self.epoch = read_local_epoch(scratch)  # layout.py, "Fencing"
        self.fenced_by: int | None = None  # the newer epoch found, once fenced
        self._gen = new_generation(self.epoch)
        self._gen_started = time.time()
        self._seq = 0  # next segment number of the generation
        self._base_ready = False  # `replica/current` names this generation
        self._base_through = 0  # its newest base holds every batch up to this one
        self._base_due = False
        self._garbage: deque[str] = deque()  # objects no restore reads any more
        resumed = _take_resume(scratch, store, tier, self.epoch)
        if resumed is not None:
            self._gen, self._seq = resumed
            self._base_ready = True
        self._base_done = time.monotonic()
        self._log_bytes = 0  # shipped since the generation's newest base
        self._base_bytes = 0  # that base's size (0: not shipped by this process)
        self._closing = False
        self._lags: deque[float] = deque(maxlen=LAG_SAMPLES)
        self.segments = self.bases = self.failures = self.overflows = 0
        self.shipped_bytes = 0
        self.last_error: str | None = None
        self._check_fence_at_start()
        spawn = store.runtime.thread
        self._threads = [
            spawn("vault-replica-log", self._ship_loop),
            spawn("vault-replica-base", self._base_loop),
        ]

    # -- writer side (the writer thread) -----------------------------------------------
    def record(self, w: WriteTxn) -> tuple[WriteTxn, Recording]:
        rec = Recording()
        # Stand-ins for lmdb.Transaction: they forward everything and record the writes.
        catalog: Any = RecordingTxn(w.catalog, CATALOG, self._dbs[CATALOG], rec)
        frames: Any = RecordingTxn(w.frames, FRAMES, self._dbs[FRAMES], rec)
        return WriteTxn(catalog, frames), rec

    def committed(self, records: list[Any]) -> Future[None] | None:
        changes = [r for rec in records for r in rec.by_env[FRAMES]]
        changes += [r for rec in records for r in rec.by_env[CATALOG]]
        if not changes:
            return None
        ack: Future[None] | None = Future() if self.config.mode == "sync" else None
        now = time.time()
        with self._cond:
            if self.fenced_by is not None:  # accepted before the fence was found: local only
                if ack is not None:
                    ack.set_exception(self._fenced_error())
                return ack
            self._batch += 1
            body = BatchLog(self._batch, now, changes).encode()
            self._queue.append(_Queued(self._batch, now, body))
            self._pending.append((self._batch, now, ack))
            self._queued_bytes += len(body)
            if self._queued_bytes > self.config.max_backlog:
                self._overflow()
            self._cond.notify_all()
        return ack

    # -- state changes (holding the lock) ------------------------------------------------
    def _overflow(self) -> None:
        """Too much queued: drop it; a new generation's base will hold those batches."""
        self.overflows += 1
        log.warning("replication backlog over %d bytes: starting a new base", self._queued_bytes)
        self._queue.clear()
        self._queued_bytes = 0
        self._start_generation()

    def _start_generation(self) -> None:
        """From the next batch on, log into a new generation; the old one stays the replica
        (a consistent prefix) until the new one's base is complete."""
        self._gen = new_generation(self.epoch)
        self._gen_started = time.time()
        self._seq = 0
        self._shipped = 0
        self._base_ready = False
        self._log_bytes = 0

    def _advance(self, through: int) -> None:
        """Every batch up to `through` is restorable: acknowledge and time them."""
        if through <= self._restorable:
            return
        self._restorable = through
        now = time.time()
        while self._pending and self._pending[0][0] <= through:
            _, committed_at, ack = self._pending.popleft()
            self._lags.append(now - committed_at)
            if ack is not None:
                ack.set_result(None)
        self._cond.notify_all()

    # -- fencing (vault/replication/layout.py) -------------------------------------------
    def _fenced_error(self) -> Fenced:
        return Fenced(
            f"this server wrote the replica in tier {self.config.tier} at epoch {self.epoch}, "
            f"and a standby was promoted to epoch {self.fenced_by}: it takes no more writes"
        )

    def _check_fence_at_start(self) -> None:
        """A primary coming back after a promotion must not take one write. A store that
        does not answer cannot tell; the first segment's check will."""
        try:
            fenced = fenced_past(self._tier, self.epoch)
        except Exception as e:  # noqa: BLE001 - the store is down: checked again after each put
            log.warning("replica: cannot check the fence in %s: %s", self.config.tier, e)
            return
        if fenced:
            self._fence()

    def _still_ours(self) -> bool:
        """Checked after each put, before it counts (rule 1): False once fenced."""
        if self.fenced_by is None and fenced_past(self._tier, self.epoch):
            self._fence()
        return self.fenced_by is None

    def _fence(self) -> None:
        """A newer epoch exists: ship nothing more, fail the commits waiting for the replica,
        refuse every change from now on."""
        with self._cond:
            if self.fenced_by is not None:
                return
            self.fenced_by = self.epoch + 1
            error = self._fenced_error()
            log.error("%s", error)
            self._s.writer.refuse(self._fenced_error)
            self._queue.clear()
            self._queued_bytes = 0
            self._garbage.clear()
            while self._pending:
                ack = self._pending.popleft()[2]
                if ack is not None:
                    ack.set_exception(self._fenced_error())
            self._cond.notify_all()

    # -- observers -----------------------------------------------------------------------
    def status(self) -> ReplicationStatus:
        """Lag and counters for /metrics and `ckpt stats`."""
        now = time.time()
        with self._cond:
            oldest = self._pending[0][1] if self._pending else None
            lag = max(0.0, now - oldest) if oldest is not None else 0.0
            lags = sorted(self._lags)
            return ReplicationStatus(
                tier=self.config.tier,
                mode=self.config.mode,
                epoch=self.epoch,
                fenced_by=self.fenced_by,
                generation=self._gen,
                lag_seconds=round(lag, 3),
                lag_bytes=self._queued_bytes,
                lag_budget=self.config.lag_budget,
                queued_batches=len(self._pending),
                base_pending=not self._base_ready,
                lag_p50=quantile(lags, 0.5),
                lag_p99=quantile(lags, 0.99),
                batches=self._batch,
                restorable_batch=self._restorable,
                segments=self.segments,
                bases=self.bases,
                shipped_bytes=self.shipped_bytes,
                failures=self.failures,
                overflows=self.overflows,
                last_error=self.last_error,
            )

    def wait_restorable(self, timeout: float) -> bool:
        """Wait until every batch committed so far is in the replica; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            target = self._batch
            while self._restorable < target:
                left = deadline - time.monotonic()
                if left <= 0 or self.fenced_by is not None:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Ship what is queued (for up to `timeout` seconds), then stop; the writer must be
        closed already. Caught up, leave `replica.resume` so the next start continues."""
        caught_up = self.wait_restorable(timeout)
        with self._cond:
            self._closing = True
            caught_up = caught_up and self._base_ready and not self._queue
            caught_up = caught_up and self.fenced_by is None
            gen, seq = self._gen, self._seq
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout)  # an upload may hang on a dead store; the threads are daemons
        if caught_up:
            s = self._s
            write_resume(self._scratch, s, self._tier.name, self.epoch, gen, seq)

    # -- the log thread ------------------------------------------------------------------
    def _ship_loop(self) -> None:
        retry = RETRY_MIN
        while True:
            with self._cond:
                while not (self._stopped() or self._queue):
                    self._cond.wait()
                if self._stopped():
                    return
                gen, seq, items = self._gen, self._seq, list(self._queue)
            try:
                self._ship_segment(gen, seq, items)
                retry = RETRY_MIN
            except Exception as e:  # noqa: BLE001 - the store is down or failing: retry
                retry = self._failed(e, retry)

    def _stopped(self) -> bool:
        return self._closing or self.fenced_by is not None

    def _failed(self, e: Exception, retry: float) -> float:
        self.failures += 1
        self.last_error = f"{type(e).__name__}: {e}"[:300]
        log.warning("replication to %s failed: %s", self.config.tier, self.last_error)
        with self._cond:
            if not self._closing:
                self._cond.wait(timeout=retry)  # paces retries; woken by close()
        return min(RETRY_MAX, retry * 2)

    def _ship_segment(self, gen: str, seq: int, items: list[_Queued]) -> None:
        blob = self._seal(b"".join(q.body for q in items), SEGMENT_CONTEXT)
        try:
            self._tier.put(segment_key(gen, seq), blob, if_absent=True)
        except ObjectExists:
            if self._tier.get(segment_key(gen, seq)) == blob:
                pass  # our own put, retried after its answer was lost (sealing: unique)
            else:
                self._foreign(gen, seq)
                return
        if not self._still_ours():
            return
        with self._cond:
            self.segments += 1
            self.shipped_bytes += len(blob)
            if self._gen != gen:  # dropped by an overflow meanwhile: a base covers them
                return
            for _ in items:
                done = self._queue.popleft()
                self._queued_bytes -= len(done.body)
            self._seq = seq + 1
            self._shipped = items[-1].batch
            self._log_bytes += len(blob)
            if self._base_ready:
                self._advance(self._shipped)
            self._cond.notify_all()

    def _foreign(self, gen: str, seq: int) -> None:
        """Segment `seq` of `gen` was written by someone else: leave them the generation."""
        log.error("replica segment %s/%d exists: another writer; starting anew", gen, seq)
        with self._cond:
            if self._gen == gen:
                self._start_generation()
                self._cond.notify_all()

    # -- the base thread -----------------------------------------------------------------
    def _base_loop(self) -> None:
        retry = RETRY_MIN
        checked, dead = float("-inf"), False
        while True:
            if time.monotonic() - checked >= REBASE_CHECK:  # outside the lock: page stats
                with self._cond:
                    replica = self._base_bytes + self._log_bytes
                envs = (self._s.catalog_env, self._s.frames_env)
                checked, dead = time.monotonic(), rebase_due(replica, envs)
            with self._cond:
                idle = not (self._stopped() or not self._base_ready or self._due(dead))
                if idle and not self._garbage:
                    self._cond.wait(timeout=REBASE_CHECK)
                    continue
                if self._stopped():
                    return
                base = not self._base_ready or self._due(dead)
                gen, seq, through = self._gen, self._seq, self._batch
            try:
                if base:
                    self._ship_base(gen, seq, through)
                    checked = float("-inf")  # the replica's size changed: judge it anew
                elif self._still_ours():
                    for _ in range(min(FORGET_STEP, len(self._garbage))):
                        self._tier.delete(self._garbage[0])
                        self._garbage.popleft()
                retry = RETRY_MIN
            except Exception as e:  # noqa: BLE001 - the store is down or failing: retry
                retry = self._failed(e, retry)

    def _due(self, dead: bool) -> bool:
        """A new base of the current generation, so restore replays a bounded log, and
        early once the log holds mostly dead bytes (`dead`: rebase.py's rule, evaluated
        at most every `REBASE_CHECK` outside the lock, which every writer batch takes)."""
        return self._base_ready and (
            time.monotonic() - self._base_done > self.config.base_interval
            or self._log_bytes > self.config.base_after_bytes
            or dead
        )

    def _seal(self, raw: bytes, context: bytes) -> bytes:
        packed = zstandard.ZstdCompressor(level=1).compress(raw)
        return self._s.keyring.seal_blob(packed, context) if self._s.keyring else packed

    def _ship_base(self, gen: str, seq: int, through: int) -> None:
        """Copy both environments and upload them as generation `gen`'s base at segment
        `seq`, then point `replica/current` at it. Segments below `seq` were uploaded
        before the copies began, so the copies hold all they hold (and batch `through`)."""
        size = 0
        envs = (("frames", self._s.frames_env), ("catalog", self._s.catalog_env))
        for name, env in envs:
            blob = self._seal(_copy(env, self._scratch), BASE_CONTEXT)
            self._tier.put(base_key(gen, seq, name), blob)
            size += len(blob)
        write_current(self._tier, Current(self.epoch, gen, seq, through))
        if not self._still_ours():
            return
        with self._cond:
            self.bases += 1
            self.shipped_bytes += size
            if self._gen == gen:
                self._base_ready = True
                self._base_done = time.monotonic()
                self._log_bytes = 0
                self._base_bytes = size
                self._advance(max(through, self._shipped))
            else:  # a newer generation began meanwhile; this one is still a valid replica
                self._advance(through)
        self._forget(gen, seq)

    def _forget(self, gen: str, seq: int) -> None:
        """Queue for deletion what no restore reads now that `gen`@`seq` is current: older
        generations and epochs, this one's older bases and segments; never a fence, nor
        anything of a newer epoch (a promotion under way past this one)."""
        keep = {base_key(gen, seq, n) for n in ("frames", "catalog")} | {current_key(self.epoch)}
        floor = segment_key(gen, seq)
        mine = generation_key(gen, "")

        def old(key: str) -> bool:
            epoch = epoch_of(key)
            if key in keep or epoch is None or epoch > self.epoch:
                return False
            return not key.startswith(mine) or key.startswith(mine + "base-") or key < floor

        try:
            garbage = [k for k in self._tier.list(PREFIX) if old(k)]
        except Exception as e:  # noqa: BLE001 - leftovers go with the next base
            log.warning("could not list old replica objects: %s", e)
            return
        with self._cond:
            if self._gen != gen or self.fenced_by is not None:  # the listing may hold theirs
                return
            self._garbage = deque(garbage)
            self._cond.notify_all()


def write_resume(
    vault_dir: Path,
    store: ShipperParts | tuple[Env, Env],
    tier: str,
    epoch: int,
    gen: str,
    seq: int,
) -> None:
    """Record that the data dir is exactly generation `gen` up to segment `seq` (excluded),
    as epoch `epoch`'s primary. `store`: the store, or its (catalog, frames) environments."""
    catalog, frames = store if isinstance(store, tuple) else (store.catalog_env, store.frames_env)
    state = {
        "tier": tier,
        "epoch": epoch,
        "generation": gen,
        "next_segment": seq,
        "catalog_txn": catalog.lmdb.info()["last_txnid"],
        "frames_txn": frames.lmdb.info()["last_txnid"],
    }
    tmp = vault_dir / (RESUME + ".partial")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, vault_dir / RESUME)


def _take_resume(
    vault_dir: Path, store: ShipperParts, tier: Tier, epoch: int
) -> tuple[str, int] | None:
    """Where to continue, if `replica.resume` allows it (removed either way: once used, a
    later crash must not find it)."""
    path = vault_dir / RESUME
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    path.unlink()
    same = (
        state.get("tier") == tier.name
        and state.get("epoch", 0) == epoch
        and state.get("catalog_txn") == store.catalog_env.lmdb.info()["last_txnid"]
        and state.get("frames_txn") == store.frames_env.lmdb.info()["last_txnid"]
    )
    if not same:
        return None
    try:
        current = read_current(tier, epoch)
    except Exception as e:  # noqa: BLE001 - cannot tell: a new generation is always safe
        log.warning("replica: cannot read the current generation (%s); starting anew", e)
        return None
    if current is None or current.generation != state["generation"] or current.end_segment:
        return None
    return str(state["generation"]), int(state["next_segment"])


def _copy(env: Env, scratch: Path) -> bytes:
    fd, name = tempfile.mkstemp(prefix=".replica-base-", dir=scratch)
    try:
        env.copy_to(fd)
        os.lseek(fd, 0, os.SEEK_SET)
        return Path(name).read_bytes()
    finally:
        os.close(fd)
        os.unlink(name)


def quantile(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)
