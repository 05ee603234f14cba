"""Catalog backups from the running service: to a tier (by default the last one configured,
the coldest) or to a path on the server. In a tier a backup is `catalog/<time>.mdb` plus
`catalog/latest`, which names the newest; restore reads `latest`. With encryption on, the
copy is sealed (it holds manifests, chunk ids and inline frames) wherever it goes."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from vault import InvalidRequest, Vault

LATEST = "catalog/latest"
SEAL_CONTEXT = b"ckpt catalog backup"  # associated data: a sealed backup opens only as one


def backup(vault: Vault, data_dir: Path, to: str | None) -> dict[str, Any]:
    started = time.monotonic()
    tiers = vault.store.tiers
    target = to if to is not None else (list(tiers)[-1] if tiers else None)
    if target is None:
        raise InvalidRequest("no tier is configured: give `to`, a tier name or a server path")
    fd, tmp_name = tempfile.mkstemp(prefix=".catalog-backup-", dir=data_dir)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        size = vault.backup_catalog(tmp)
        keyring = vault.store.keyring
        if keyring is not None:
            tmp.write_bytes(keyring.seal_blob(tmp.read_bytes(), SEAL_CONTEXT))
            os.chmod(tmp, 0o600)
        if target in tiers:
            key = f"catalog/{time.strftime('%Y%m%dt%H%M%S', time.gmtime())}-{os.getpid()}.mdb"
            tiers[target].put(key, tmp.read_bytes())
            tiers[target].put(LATEST, key.encode())
            where: dict[str, Any] = {"tier": target, "key": key}
        elif os.path.isabs(target):
            os.replace(tmp, target)
            where = {"path": target}
        else:
            raise InvalidRequest(f"{target!r} is neither a configured tier nor an absolute path")
    finally:
        tmp.unlink(missing_ok=True)
    return {
        **where,
        "bytes": size,
        "sealed": keyring is not None,
        "seconds": round(time.monotonic() - started, 3),
    }
