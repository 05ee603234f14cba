"""The engine as the configuration describes it: tier backends (each behind `RetryingTier`),
the keyring, and the `Vault` over `DATA/vault`.

One function for both places that open it: the app's cleanup context (api/app.py) and the
offline `ckpt` commands (`check --data`, `gc --data`), which must see the same tiers, key
and engine settings (GC grace, map size) as the server they stand in for.
"""

from __future__ import annotations

from checkpoint_vault.tiering import open_tier
from checkpoint_vault.tiering.wrappers import RetryingTier
from checkpoint_vault.vault import Clock, Keyring, Vault
from checkpoint_vault.vault.runtime import Runtime

from .settings import Settings


def open_vault(
    settings: Settings,
    clock: Clock | None = None,
    runtime: Runtime | None = None,
    *,
    reader: bool = False,
) -> Vault:
    """Open (creating if needed) the vault of `settings.data_dir`; blocking. `runtime`: the
    service's (api/app.py); the offline commands let the vault make its own. `reader`: a
    worker's, beside the process that writes (api/workers.py).

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
