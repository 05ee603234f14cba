"""Rebuild a data dir from the replica: the current generation's base, then its log.

The replica is the newest epoch's `current` (vault/replication/layout.py). The data dir is
built in a scratch directory inside the target and moved into place only once every segment
is applied, so an interrupted restore leaves no half-made vault that a
server could open. Segments are applied in order as the writer committed them: frame
records, then catalog records, up to 64 MiB of log per pair of transactions (the scratch
dir needs no sync per segment; nothing reads it before the move). Replay stops at the
first missing segment number (segments are uploaded strictly in order, so there is none
unless the log was tampered with), at the fence point of a promotion (`end_segment`), or,
with `until`, before the first batch committed after that time (point-in-time restore).
A standby builds the replica the same way (`build`) before it converges onto it.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import lmdb
import zstandard

from checkpoint_vault.protocol import ReplicaRestored

from ..env import CATALOG_DBS, FRAME_DBS, Env
from ..errors import Conflict, ObjectNotFound
from ..maintenance import offline_hold
from ..seal import Keyring, open_blob
from ..syncer import DURABLE_FILE
from ..tier import Tier
from .changes import CATALOG, ENV_DBS, FRAMES, BatchLog, decode_batches, replay
from .layout import Current, base_key, replica_current, segment_key, write_local_epoch
from .shipper import BASE_CONTEXT, SEGMENT_CONTEXT, write_resume

PREFETCH = 16  # segment GETs in flight during a restore
GROUP_BYTES = 64 << 20  # log applied per pair of transactions (one sync each)


def open_body(raw: bytes, keyring: Keyring | None, context: bytes) -> bytes:
    """A base or segment object's plain bytes (unsealed, decompressed)."""
    return zstandard.ZstdDecompressor().decompressobj().decompress(open_blob(keyring, raw, context))


@dataclass(frozen=True)
class Built:
    """What `build` replayed: segments up to `next_segment` (excluded)."""

    next_segment: int
    batches: int
    last: float | None  # commit time of the last batch replayed
    cut: bool  # `until` stopped the replay before the end of the log


def restore_replica(
    tier: Tier, vault_dir: Path, keyring: Keyring | None = None, until: float | None = None
) -> ReplicaRestored:
    """Make the empty `vault_dir` the replica in `tier` (offline, like a catalog restore).
    The data dir takes the replica's epoch: a server started on it writes under that epoch
    (and is fenced at once if a promotion has claimed a newer one meanwhile)."""
    started = time.monotonic()
    current = replica_current(tier)
    vault_dir.mkdir(parents=True, exist_ok=True)
    if (vault_dir / "catalog" / "data.mdb").exists():
        raise Conflict(f"{vault_dir} already holds a catalog; restore into an empty data dir")
    with (
        offline_hold(vault_dir, "replica restore"),
        tempfile.TemporaryDirectory(dir=vault_dir, prefix=".restore-") as tmp,
    ):
        work = Path(tmp)
        # Offline, outside any service's runtime: the command's own fetch threads.
        with ThreadPoolExecutor(PREFETCH, thread_name_prefix="vault-fetch") as pool:
            built = build(tier, current, keyring, until, work, pool)
        (vault_dir / DURABLE_FILE).unlink(missing_ok=True)  # the state of files now replaced
        for sub in ("catalog", "frames"):
            (work / sub / "vault.lock").unlink(missing_ok=True)
            shutil.move(str(work / sub), str(vault_dir / sub))
        write_local_epoch(vault_dir, current.epoch)
        # The whole log of a generation of this epoch: a server started here may continue it.
        if not built.cut and current.end_segment is None:
            catalog, frames = open_envs(vault_dir)
            try:
                write_resume(
                    vault_dir,
                    (catalog, frames),
                    tier.name,
                    current.epoch,
                    current.generation,
                    built.next_segment,
                )
            finally:
                catalog.close()
                frames.close()
    return ReplicaRestored(
        epoch=current.epoch,
        generation=current.generation,
        base_segment=current.base_segment,
        segments=built.next_segment - current.base_segment,
        batches=built.batches,
        through=built.last,
        seconds=round(time.monotonic() - started, 3),
    )


def open_envs(root: Path) -> tuple[Env, Env]:
    """The catalog and frame environments under `root` (catalog/, frames/)."""
    catalog = Env(root / "catalog", names=CATALOG_DBS)
    try:
        return catalog, Env(root / "frames", names=FRAME_DBS)
    except BaseException:
        catalog.close()
        raise


def build(
    tier: Tier,
    current: Current,
    keyring: Keyring | None,
    until: float | None,
    work: Path,
    pool: Executor,
) -> Built:
    """The replica `current` names, as the two environments under the empty `work`: its
    base, then its log up to the first missing segment, the fence point or `until`;
    segments fetched on `pool` (a standby's runtime's `fetch`)."""
    first = current.base_segment
    for sub in ("catalog", "frames"):
        (work / sub).mkdir()
        raw = tier.get(base_key(current.generation, first, sub))
        (work / sub / "data.mdb").write_bytes(open_body(raw, keyring, BASE_CONTEXT))
    catalog, frames = open_envs(work)
    try:
        return _replay(tier, current, keyring, until, catalog, frames, pool)
    finally:
        catalog.close()
        frames.close()


def segments(
    tier: Tier,
    current: Current,
    first: int,
    keyring: Keyring | None,
    pool: Executor,
    prefetch: int = PREFETCH,
) -> Iterator[tuple[int, bytes]]:
    """(number, plain body) of segments `first`, `first`+1, ... of `current`'s generation,
    while they exist and come before its end. Fetched on `pool` by number, `prefetch` at a
    time (each GET is a round trip); never listed: a listing is no snapshot (and may be
    paged), a missing number is the end. The pool is the caller's (a standby's runtime),
    not one made per call: a standby calls this on every poll."""
    ahead: deque[Future[bytes | None]] = deque()
    fetched = seq = first
    try:
        while current.within(seq):
            while len(ahead) < prefetch and current.within(fetched):
                ahead.append(pool.submit(_fetch, tier, segment_key(current.generation, fetched)))
                fetched += 1
            raw = ahead.popleft().result()
            if raw is None:
                return
            yield seq, open_body(raw, keyring, SEGMENT_CONTEXT)
            seq += 1
    finally:
        for f in ahead:
            f.cancel()


def _replay(
    tier: Tier,
    current: Current,
    keyring: Keyring | None,
    until: float | None,
    catalog: Env,
    frames: Env,
    pool: Executor,
) -> Built:
    """Apply the log over the base in `catalog` and `frames`, up to 64 MiB of it per pair
    of transactions (the scratch dir needs no per-segment sync)."""
    envs = {CATALOG: catalog, FRAMES: frames}
    next_seq, batches = current.base_segment, 0
    last: float | None = None
    group: list[BatchLog] = []
    group_bytes = 0

    def flush() -> None:
        nonlocal group_bytes
        for env_id in (FRAMES, CATALOG):  # as the writer commits: frames first
            _apply(envs[env_id], env_id, group)
        group.clear()
        group_bytes = 0

    for seq, body in segments(tier, current, current.base_segment, keyring, pool):
        todo = list(decode_batches(body))
        cut = [b for b in todo if until is None or b.committed_at <= until]
        group += cut
        group_bytes += len(body)
        batches += len(cut)
        last = cut[-1].committed_at if cut else last
        if len(cut) < len(todo):
            flush()
            return Built(seq, batches, last, True)
        next_seq = seq + 1
        if group_bytes >= GROUP_BYTES:
            flush()
    flush()
    return Built(next_seq, batches, last, False)


def _fetch(tier: Tier, key: str) -> bytes | None:
    try:
        return tier.get(key)
    except ObjectNotFound:
        return None


def _apply(env: Env, env_id: int, batches: list[BatchLog]) -> None:
    """One segment's records of one environment, in one transaction (the map grows)."""
    names = [n.decode() for n in ENV_DBS[env_id]]
    while True:
        try:
            with env.lmdb.begin(write=True) as txn:
                for batch in batches:
                    for rec_env, kind, db_index, key, value in batch.records:
                        if rec_env != env_id:
                            continue
                        replay(txn, env.db[names[db_index]], kind, key, value)
            return
        except lmdb.MapFullError:
            env.grow()
