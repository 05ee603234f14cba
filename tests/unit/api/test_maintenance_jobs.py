"""The scheduled GC also repacks when tiers exist: what it freed in packs is dead bytes."""

from __future__ import annotations

import random
from pathlib import Path

from api.scheduler import _jobs
from tiering import MemoryTier
from tiering.runner import run_tiering
from vault import FakeClock, Vault, VaultConfig

from ..vault.helpers import stream_save


def test_scheduled_gc_repacks_what_it_freed(tmp_path: Path) -> None:
    cold = MemoryTier("cold")
    vault = Vault(tmp_path / "v", VaultConfig(gc_grace=0.0), FakeClock(), tiers={"cold": cold})
    try:
        rng = random.Random(1)
        recs = [stream_save(vault, "ns", {"w": rng.randbytes(150_000)}) for _ in range(4)]
        vault.set_policy("ns", {"tiering": {"target": "cold", "keep_hot_last": 0}})
        run_tiering(vault)
        for rec in recs[:3]:
            vault.delete("ns", rec.id)
        vault.store.clock.advance(7 * 3600)  # type: ignore[attr-defined]  # past the upload TTL
        result = _jobs(vault, 0.0)["gc"]()
        assert result["chunks_deleted"] > 0
        assert result["packs_rewritten"] == 1
        assert result["pack_bytes_freed"] > 300_000
        assert vault.stats()["tiers"]["cold"]["bytes"] == sum(
            len(cold.get(k)) for k in cold.list("packs/") if not k.endswith(".idx")
        )
    finally:
        vault.close()
