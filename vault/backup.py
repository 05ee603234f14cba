"""Catalog backup and restore: the catalog must not be the only copy of itself.

A backup is a compacted LMDB copy of the catalog taken from one read snapshot while the
service keeps writing. It goes to a tier (by default the last one configured, the coldest)
as `catalog/<time>.mdb` plus `catalog/latest` naming the newest, or to an absolute path on
the vault's machine. With encryption on, the copy is sealed with the keyring (it holds
manifests, chunk ids and inline frames) wherever it goes.

Restoring builds a data dir around it: chunks in other tiers are read from there again;
chunks whose frames lived in the hot store are gone with the old machine, so they are marked
damaged (the missing query reports them, a re-upload heals them, verify invalidates what
needs them), and new frames are numbered past every number the restored catalog mentions,
so no old pointer can ever name a new frame.

Both are maintenance operations: `Vault.catalog_backup` and `restore` take the maintenance
lock (vault/maintenance.py) themselves, whoever calls them (schedule, route, `ckpt`).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from checkpoint_vault.protocol import CatalogBackup

from .content.chunks import settle_restored
from .env import CATALOG_DBS, Env
from .errors import Conflict, InvalidRequest
from .maintenance import offline_hold
from .ownership import check_ancestors, check_entry, open_private
from .seal import Keyring, open_blob
from .syncer import DURABLE_FILE
from .tier import Tier

if TYPE_CHECKING:
    from .content.shared import SharedIndex
    from .env import Env
    from .seal import Keyring
    from .tier import Tier


class BackupParts(Protocol):
    """What a catalog backup needs of the store: the catalog, the tiers and the keyring."""

    @property
    def catalog_env(self) -> Env: ...
    @property
    def keyring(self) -> Keyring | None: ...
    @property
    def tiers(self) -> Mapping[str, Tier]: ...
    @property
    def shared(self) -> SharedIndex | None: ...


LATEST = "catalog/latest"  # in a tier: names the newest backup's key
SEAL_CONTEXT = b"ckpt catalog backup"  # associated data: a sealed backup opens only as one


def backup_catalog(store: BackupParts, dest: Path) -> int:
    """Write the copy to `dest` (fsynced); returns its size."""
    tmp = dest.with_name(dest.name + ".partial")
    fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        store.catalog_env.copy_to(fd)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, dest)
    return dest.stat().st_size


def backup_to(store: BackupParts, scratch: Path, to: str | None) -> CatalogBackup:
    """Back up to tier `to`, or to the absolute path `to`, or (None) to the last tier.

    The copy is made in `scratch` (a directory on the vault's file system) first, sealed
    there when a keyring is configured, then uploaded or renamed into place. The caller holds
    the maintenance lock (`Vault.catalog_backup`).
    """
    started = time.monotonic()
    tiers = store.tiers
    # never a cluster's shared tier by default: every node's `catalog/latest` would be one
    own = [n for n in tiers if store.shared is None or n != store.shared.tier_name]
    target = to if to is not None else (own[-1] if own else None)
    if target is None:  # the request is fine; the server's configuration lacks a place
        raise Conflict("no tier is configured: give `to`, a tier name or a server path")
    if target not in tiers and not os.path.isabs(target):
        raise InvalidRequest(f"{target!r} is neither a configured tier nor an absolute path")
    fd, tmp_name = tempfile.mkstemp(prefix=".catalog-backup-", dir=scratch)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        size = backup_catalog(store, tmp)
        if store.keyring is not None:
            tmp.write_bytes(store.keyring.seal_blob(tmp.read_bytes(), SEAL_CONTEXT))
            os.chmod(tmp, 0o600)
        where = _place(tiers, target, tmp)
    finally:
        tmp.unlink(missing_ok=True)
    return replace(
        where,
        bytes=size,
        sealed=store.keyring is not None,
        seconds=round(time.monotonic() - started, 3),
    )


def _place(tiers: Mapping[str, Tier], target: str, tmp: Path) -> CatalogBackup:
    """Store the copy; what it answers says where (the figures are filled in after)."""
    if target in tiers:
        key = f"catalog/{time.strftime('%Y%m%dt%H%M%S', time.gmtime())}-{os.getpid()}.mdb"
        tiers[target].put(key, tmp.read_bytes())
        tiers[target].put(LATEST, key.encode())
        return CatalogBackup(tier=target, key=key)
    # The copy replaces the file there (a rename never follows a link); a directory other
    # users can rename entries in, or a file there that is not ours, is refused: else the
    # backup a restore would trust could be swapped for another user's.
    check_ancestors(Path(target))
    check_entry(Path(target), stat.S_IFREG)
    os.replace(tmp, target)
    return CatalogBackup(path=target)


def latest_backup(tier: Tier) -> tuple[str, bytes]:
    """The newest backup in a tier: its key and its (possibly sealed) bytes."""
    key = tier.get(LATEST).decode()
    return key, tier.get(key)


def restore(raw: bytes, vault_dir: Path, keyring: Keyring | None = None) -> dict[str, int]:
    """Make the empty `vault_dir` a vault whose catalog is the backup `raw` (sealed or not;
    a sealed one needs the keyring it was sealed with). Offline: the vault must not be open
    anywhere; holds `vault_dir`'s maintenance lock, waiting for nobody."""
    plain = open_blob(keyring, raw, SEAL_CONTEXT)
    vault_dir.mkdir(parents=True, exist_ok=True)
    with (
        offline_hold(vault_dir, "catalog restore"),
        tempfile.TemporaryDirectory(dir=vault_dir, prefix=".restore-") as tmp,
    ):
        copy = Path(tmp) / "catalog.mdb"
        copy.write_bytes(plain)
        return restore_catalog(copy, vault_dir)


def restore_catalog(src: Path, vault_dir: Path) -> dict[str, int]:
    """Make `vault_dir` a vault whose catalog is the plain backup file `src` (offline; the
    caller holds the maintenance lock, as `restore` does)."""
    catalog_dir = vault_dir / "catalog"
    if (catalog_dir / "data.mdb").exists():
        raise Conflict(f"{vault_dir} already holds a catalog; restore into an empty data dir")
    catalog_dir.mkdir(parents=True, exist_ok=True)
    (vault_dir / DURABLE_FILE).unlink(missing_ok=True)  # the durable state of files now gone
    shutil.copyfile(src, catalog_dir / "data.mdb")
    env = Env(catalog_dir, names=CATALOG_DBS)
    try:
        return settle_restored(env)
    finally:
        env.close()
