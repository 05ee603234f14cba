"""Staged tiering: warm after a day, cold after a week; chunks move on from tier to tier,
the packs they leave are deleted, and everything reads back from wherever it is."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.tiering import MemoryTier
from checkpoint_vault.tiering.runner import run_tiering
from checkpoint_vault.vault import FakeClock, InvalidRequest, Vault, VaultConfig

from ..vault.helpers import read_file, stream_save

DAY = 86400.0


@pytest.fixture
def tiers() -> dict[str, MemoryTier]:
    return {"warm": MemoryTier("warm"), "cold": MemoryTier("cold")}  # declared warm first


@pytest.fixture
def vault(tmp_path: Path, tiers: dict[str, MemoryTier]) -> Iterator[Vault]:
    v = Vault(tmp_path / "v", VaultConfig(gc_grace=0.0), FakeClock(), tiers=tiers)
    yield v
    v.close()


def _packs(tier: MemoryTier) -> list[str]:
    return [k for k in tier.list("packs/") if not k.endswith(".idx")]


def test_chunks_move_on_from_warm_to_cold(vault: Vault, tiers: dict[str, MemoryTier]) -> None:
    clock: FakeClock = vault.store.clock  # type: ignore[assignment]
    rng = random.Random(2)
    saved = []
    for _ in range(3):
        data = rng.randbytes(150_000)
        saved.append((stream_save(vault, "ns", {"w": data}), data))
        clock.advance(DAY)
    vault.set_policy(
        "ns",
        {
            "tiering": {
                "target": "warm",
                "demote_after": "1d",
                "keep_hot_last": 0,
                "stages": [{"tier": "cold", "after": "7d"}],
            }
        },
    )
    run_tiering(vault)
    assert [vault.get("ns", r.id).tier for r, _ in saved] == ["warm", "warm", "warm"]
    clock.advance(5 * DAY)  # the oldest is now 8 days old, the others 7 and 6
    plan = run_tiering(vault, dry_run=True)
    assert plan.tiers["cold"].from_other_tiers > 0
    done = run_tiering(vault)
    assert done.moved is not None
    carried = done.moved["cold"].from_other_tiers
    assert carried is not None
    assert carried.chunks_moved is not None
    assert carried.chunks_moved > 0
    assert [vault.get("ns", r.id).tier for r, _ in saved] == ["cold", "cold", "warm"]
    for rec, data in saved:
        assert read_file(vault, "ns", rec.id, "w") == data
    clock.advance(DAY)
    run_tiering(vault)  # the last one follows; the warm packs it leaves are deleted
    assert [vault.get("ns", r.id).tier for r, _ in saved] == ["cold"] * 3
    assert _packs(tiers["warm"]) == []
    stats = vault.stats().tiers
    assert stats["warm"].chunks == 0
    assert stats["cold"].chunks + stats["hot"].chunks == vault.stats().chunks
    for rec, data in saved:
        assert read_file(vault, "ns", rec.id, "w") == data
    assert vault.check().ok


def test_stages_are_checked_when_set(vault: Vault) -> None:
    stream_save(vault, "ns", {"w": b"x"})
    for bad in (
        {"demote_after": "7d", "stages": [{"tier": "cold", "after": "1d"}]},  # not later
        {"stages": [{"tier": "cold"}]},
        {"stages": {"tier": "cold", "after": "1d"}},
        {"stages": [{"tier": 3, "after": "1d"}]},
    ):
        with pytest.raises(InvalidRequest):
            vault.set_policy("ns", {"tiering": bad})
    vault.set_policy(
        "ns", {"tiering": {"target": "warm", "stages": [{"tier": "nope", "after": "1d"}]}}
    )
    with pytest.raises(InvalidRequest, match="not configured"):
        run_tiering(vault, dry_run=True)
