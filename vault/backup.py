"""Catalog backup and restore: the catalog must not be the only copy of itself.

A backup is a compacted LMDB copy of the catalog taken from one read snapshot while the
service keeps writing. Restoring builds a data dir around it: chunks in other tiers are
read from there again; chunks whose frames lived in the hot store are gone with the old
machine, so they are marked damaged (the missing query reports them, a re-upload heals
them, verify invalidates what needs them), and new frames are numbered past every number
the restored catalog mentions, so no old pointer can ever name a new frame.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .blocks import FLAG_DAMAGED, INLINE, PACKED, SEQ_FLOOR, ChunkMeta, Counters
from .env import CATALOG_DBS, Env
from .errors import Conflict
from .store import Store


def backup_catalog(store: Store, dest: Path) -> int:
    """Write the copy to `dest` (fsynced); returns its size."""
    tmp = dest.with_name(dest.name + ".partial")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        store.env.copy_to(fd)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, dest)
    return dest.stat().st_size


def restore_catalog(src: Path, vault_dir: Path) -> dict[str, int]:
    """Make `vault_dir` a vault whose catalog is the backup at `src` (offline)."""
    catalog_dir = vault_dir / "catalog"
    if (catalog_dir / "data.mdb").exists():
        raise Conflict(f"{vault_dir} already holds a catalog; restore into an empty data dir")
    catalog_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, catalog_dir / "data.mdb")
    env = Env(catalog_dir, names=CATALOG_DBS)
    try:
        return _settle(env)
    finally:
        env.close()


def _settle(env: Env) -> dict[str, int]:
    db = env.db["chunkmeta"]
    lost = cold = 0
    highest = 0
    with env.lmdb.begin(write=True) as txn:
        for key, raw in list(txn.cursor(db=db)):
            meta = ChunkMeta.unpack(raw)
            if meta.seq == PACKED:
                cold += 1
                continue
            if meta.seq != INLINE:
                highest = max(highest, meta.seq)
                lost += 1
                txn.put(key, meta._replace(flags=meta.flags | FLAG_DAMAGED).pack(), db=db)
        Counters(env).add(txn, SEQ_FLOOR, highest + 1)
    return {"cold_chunks": cold, "lost_hot_chunks": lost}
