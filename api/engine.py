"""The engine as the configuration describes it: tier backends (each behind `RetryingTier`),
the keyring, and the `Vault` over `DATA/vault`.

One function for both places that open it: the app's cleanup context (api/app.py) and the
offline `ckpt` commands (`check --data`, `gc --data`), which must see the same tiers, key
and engine settings (GC grace, map size) as the server they stand in for.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from checkpoint_vault.tiering import open_tier
from checkpoint_vault.tiering.wrappers import RetryingTier
from checkpoint_vault.vault import Clock, Keyring, Unavailable, Vault
from checkpoint_vault.vault.ownership import open_private
from checkpoint_vault.vault.runtime import Runtime

from .settings import Settings

READERS_LOCK = "workers.lock"  # in the vault dir: held shared by every worker (node/)
READERS_WAIT = 15.0  # seconds a starting writer waits for a predecessor's workers to die


def open_vault(
    settings: Settings,
    clock: Clock | None = None,
    runtime: Runtime | None = None,
    *,
    reader: bool = False,
) -> Vault:
    """Open (creating if needed) the vault of `settings.data_dir`; blocking. `runtime`: the
    service's (api/app.py); the offline commands let the vault make its own. `reader`: a
    worker's, beside the process that writes (node/supervisor.py).

    Raises the engine's "in use" error (`VaultInUse`) if another process has it open.
    """
    tiers = {
        name: RetryingTier(
            open_tier(name, spec["url"], {k: v for k, v in spec.items() if k != "url"})
        )
        for name, spec in settings.tiers.items()
    }
    keyring = Keyring.load(settings.key_file) if settings.key_file is not None else None
    return Vault(
        settings.data_dir / "vault",
        settings.vault,
        clock,
        tiers,
        keyring,
        None if reader else settings.replication,
        None if reader else settings.following,
        runtime,
        reader=reader,
    )


def readers_lock(settings: Settings) -> Path:
    return settings.data_dir / "vault" / READERS_LOCK


@contextmanager
def no_readers(settings: Settings) -> Iterator[None]:
    """Hold `workers.lock` exclusively: no worker of an earlier writer is still reading.
    Waits up to READERS_WAIT seconds (they die with their writer, within milliseconds)."""
    path = readers_lock(settings)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with os.fdopen(open_private(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab") as f:
        deadline = time.monotonic() + READERS_WAIT
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise Unavailable(
                        f"{path.parent} is still read by worker processes of an earlier "
                        "server; stop them first"
                    ) from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def hold_shared(settings: Settings) -> IO[bytes]:
    """A worker's share of `workers.lock`, for its life (the kernel drops it at exit)."""
    f = os.fdopen(
        open_private(readers_lock(settings), os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab"
    )
    fcntl.flock(f.fileno(), fcntl.LOCK_SH)
    return f
