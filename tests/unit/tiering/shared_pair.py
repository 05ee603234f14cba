"""Two vaults over one memory tier, shards 0 and 1 of one cluster with a shared tier, and
the store's clock the test moves (the one the shared GC's grace is counted in)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from checkpoint_vault.tiering import MemoryTier
from checkpoint_vault.vault import FakeClock, Vault, VaultConfig


class StoreClock:
    """Last-Modified of what the memory tier is given."""

    def __init__(self, grace: float) -> None:
        self.now = 1_000_000.0
        self.grace = grace

    def __call__(self) -> float:
        return self.now

    def pass_grace(self) -> None:
        self.now += self.grace + 2


@contextmanager
def vault_pair(root: Path, tier: MemoryTier, **config: Any) -> Iterator[tuple[Vault, Vault]]:
    """Vaults "a" (shard 0) and "b" (shard 1) packing into `tier` as their shared tier;
    `config`: more VaultConfig fields."""
    vaults = [
        Vault(
            root / name,
            VaultConfig(
                gc_grace=0.0,
                shared_tier="shared",
                shared_writer=f"{name}-s{shard}",
                shared_shard=shard,
                shared_shards=2,
                **config,
            ),
            FakeClock(),
            tiers={"shared": tier},
        )
        for shard, name in enumerate(("a", "b"))
    ]
    try:
        yield vaults[0], vaults[1]
    finally:
        for v in vaults:
            v.close()
