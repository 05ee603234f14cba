"""Rebuild a data dir from the replica: the current generation's base, then its log.

The data dir is built in a scratch directory inside the target and moved into place only
once every segment is applied, so an interrupted restore leaves no half-made vault that a
server could open. Segments are applied in order as the writer committed them: frame
records, then catalog records, up to 64 MiB of log per pair of transactions (the scratch
dir needs no sync per segment; nothing reads it before the move). Replay stops at the
first missing segment number (segments are uploaded strictly in order, so there is none
unless the log was tampered with) or, with `until`, before the first batch committed after
that time (point-in-time restore).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import lmdb
import zstandard

from ..env import CATALOG_DBS, FRAME_DBS, Env
from ..errors import Conflict, ObjectNotFound, ReplicaNotFound
from ..maintenance import MaintenanceLock
from ..seal import Keyring, open_blob
from ..tier import Tier
from .changes import CATALOG, DELETE, DROP, ENV_DBS, FRAMES, PUT, BatchLog, decode_batches
from .shipper import (
    BASE_CONTEXT,
    CURRENT,
    SEGMENT_CONTEXT,
    base_key,
    segment_key,
    write_resume,
)

PREFETCH = 16  # segment GETs in flight during a restore
GROUP_BYTES = 64 << 20  # log applied per pair of transactions (one sync each)


def _open(raw: bytes, keyring: Keyring | None, context: bytes) -> bytes:
    return zstandard.ZstdDecompressor().decompressobj().decompress(open_blob(keyring, raw, context))


def restore_replica(
    tier: Tier, vault_dir: Path, keyring: Keyring | None = None, until: float | None = None
) -> dict[str, Any]:
    """Make the empty `vault_dir` the replica in `tier` (offline, like a catalog restore)."""
    started = time.monotonic()
    try:
        current = json.loads(tier.get(CURRENT))
    except ObjectNotFound:
        raise ReplicaNotFound(f"tier {tier.name} holds no replica (no base finished)") from None
    gen, first = str(current["generation"]), int(current["base_segment"])
    vault_dir.mkdir(parents=True, exist_ok=True)
    if (vault_dir / "catalog" / "data.mdb").exists():
        raise Conflict(f"{vault_dir} already holds a catalog; restore into an empty data dir")
    with (
        MaintenanceLock.of(vault_dir).hold("replica restore", timeout=0),
        tempfile.TemporaryDirectory(dir=vault_dir, prefix=".restore-") as tmp,
    ):
        work = Path(tmp)
        for sub in ("catalog", "frames"):
            (work / sub).mkdir()
            raw = tier.get(base_key(gen, first, sub))
            (work / sub / "data.mdb").write_bytes(_open(raw, keyring, BASE_CONTEXT))
        catalog = Env(work / "catalog", names=CATALOG_DBS)
        frames = Env(work / "frames", names=FRAME_DBS)
        try:
            seq, batches, last, cut = _replay(tier, gen, first, keyring, until, catalog, frames)
        finally:
            catalog.close()
            frames.close()
        for sub in ("catalog", "frames"):
            (work / sub / "vault.lock").unlink(missing_ok=True)
            shutil.move(str(work / sub), str(vault_dir / sub))
        if not cut:  # the whole log: a server started here may continue the generation
            catalog, frames = (
                Env(vault_dir / "catalog", names=CATALOG_DBS),
                Env(vault_dir / "frames", names=FRAME_DBS),
            )
            try:
                write_resume(vault_dir, catalog, frames, tier.name, gen, seq)
            finally:
                catalog.close()
                frames.close()
    return {
        "generation": gen,
        "base_segment": first,
        "segments": seq - first,
        "batches": batches,
        "through": last,
        "seconds": round(time.monotonic() - started, 3),
    }


def _replay(
    tier: Tier,
    gen: str,
    first: int,
    keyring: Keyring | None,
    until: float | None,
    catalog: Env,
    frames: Env,
) -> tuple[int, int, float | None, bool]:
    """Apply segments `first`, `first`+1, ... while they exist; returns (next segment,
    batches, last commit time, whether `until` cut the log short). Segments are fetched by
    number, PREFETCH at a time (each GET is a round trip), and applied in order; they are
    not listed: a listing is no snapshot (and may be paged), a missing number is the end."""
    envs = {CATALOG: catalog, FRAMES: frames}
    seq, batches = first, 0
    last: float | None = None
    group: list[BatchLog] = []  # applied together: the scratch dir needs no per-segment sync
    group_bytes = 0

    def flush() -> None:
        nonlocal group_bytes
        for env_id in (FRAMES, CATALOG):  # as the writer commits: frames first
            _apply(envs[env_id], env_id, group)
        group.clear()
        group_bytes = 0

    with ThreadPoolExecutor(PREFETCH, thread_name_prefix="replica-restore") as pool:
        ahead: deque[Future[bytes | None]] = deque()
        fetched = first
        while True:
            while len(ahead) < PREFETCH:
                ahead.append(pool.submit(_fetch, tier, segment_key(gen, fetched)))
                fetched += 1
            raw = ahead.popleft().result()
            if raw is None:
                for f in ahead:
                    f.cancel()
                flush()
                return seq, batches, last, False
            body = _open(raw, keyring, SEGMENT_CONTEXT)
            todo = list(decode_batches(body))
            cut = [b for b in todo if until is None or b.committed_at <= until]
            group += cut
            group_bytes += len(body)
            batches += len(cut)
            last = cut[-1].committed_at if cut else last
            if len(cut) < len(todo):
                flush()
                return seq, batches, last, True
            if group_bytes >= GROUP_BYTES:
                flush()
            seq += 1


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
                        db = env.db[names[db_index]]
                        if kind == PUT:
                            txn.put(key, value, db=db)
                        elif kind == DELETE:
                            txn.delete(key, db=db)
                        elif kind == DROP:
                            txn.drop(db, delete=False)
            return
        except lmdb.MapFullError:
            env.grow()
