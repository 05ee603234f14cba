"""Promotion (by policy and on read) and hot watermarks, on the engine with a memory tier:
bytes come back hot verified, capacity pushes out the oldest first, rules always win."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.tiering import MemoryTier
from checkpoint_vault.tiering.runner import promote_checkpoint, run_tiering
from checkpoint_vault.vault import FakeClock, InvalidRequest, StoredCheckpoint, Vault, VaultConfig

from ..vault.helpers import read_file, stream_save

DAY = 86400.0


@pytest.fixture
def vault(tmp_path: Path) -> Iterator[Vault]:
    v = Vault(
        tmp_path / "v", VaultConfig(gc_grace=0.0), FakeClock(), tiers={"cold": MemoryTier("cold")}
    )
    yield v
    v.close()


def _save_days(
    vault: Vault, ns: str, n: int, size: int = 200_000
) -> list[tuple[StoredCheckpoint, bytes]]:
    """n checkpoints of unrelated bytes, one a day, oldest first."""
    rng = random.Random(ns)
    out = []
    for _ in range(n):
        data = rng.randbytes(size)
        out.append((stream_save(vault, ns, {"w": data}), data))
        vault.store.clock.advance(DAY)  # type: ignore[attr-defined]
    return out


def _tiers(vault: Vault, ns: str, saved: list[tuple[StoredCheckpoint, bytes]]) -> list[str]:
    return [vault.get(ns, rec.id).tier for rec, _ in saved]


def test_policy_change_brings_packed_chunks_back(vault: Vault) -> None:
    saved = _save_days(vault, "ns", 4)
    vault.set_policy(
        "ns", {"tiering": {"target": "cold", "demote_after": "1d", "keep_hot_last": 1}}
    )
    run_tiering(vault)
    assert _tiers(vault, "ns", saved) == ["cold", "cold", "cold", "hot"]
    vault.set_policy("ns", {"tiering": {"keep_hot_last": 3}})
    plan = run_tiering(vault, dry_run=True)
    assert sorted(plan.promote.checkpoints) == sorted(r.id for r, _ in saved[1:3])
    done = run_tiering(vault)
    assert done.promoted is not None
    assert done.promoted.chunks == plan.promote.chunks > 0
    assert _tiers(vault, "ns", saved) == ["cold", "hot", "hot", "hot"]
    stats = vault.stats()
    assert stats.tiers["hot"].chunks + stats.tiers["cold"].chunks == stats.chunks
    for rec, data in saved:
        assert read_file(vault, "ns", rec.id, "w") == data
    vault.set_policy("ns", {"tiering": {"target": None}})  # no target: everything comes home
    run_tiering(vault)
    assert _tiers(vault, "ns", saved) == ["hot"] * 4
    assert vault.stats().tiers["cold"].chunks == 0
    report = vault.check()
    assert report.ok
    assert report.orphan_frames == 0


def test_promotion_on_read_holds_the_checkpoint_hot_for_demote_after(vault: Vault) -> None:
    saved = _save_days(vault, "ns", 3)
    vault.set_policy(
        "ns", {"tiering": {"target": "cold", "demote_after": "1d", "promote_on_read": True}}
    )
    run_tiering(vault)
    old, data = saved[0]
    assert vault.get("ns", old.id).tier == "cold"
    result = promote_checkpoint(vault, "ns", old.id)
    assert result.moved.chunks > 0
    assert vault.get("ns", old.id).tier == "hot"
    assert read_file(vault, "ns", old.id, "w") == data
    run_tiering(vault)  # read just now: it stays hot, though created 3 days ago
    assert vault.get("ns", old.id).tier == "hot"
    vault.store.clock.advance(2 * DAY)  # type: ignore[attr-defined]
    run_tiering(vault)  # unread for longer than demote_after: it goes again
    assert vault.get("ns", old.id).tier == "cold"
    assert read_file(vault, "ns", old.id, "w") == data


def test_high_watermark_demotes_oldest_first_down_to_the_low_mark(vault: Vault) -> None:
    saved = _save_days(vault, "ns", 6, size=100_000)  # ~600 kB hot, all young enough
    vault.set_policy("ns", {"tiering": {"target": "cold", "demote_after": "30d"}})
    assert run_tiering(vault, dry_run=True).tiers == {}
    vault.set_policy(
        None, {"tiering": {"hot_high_watermark": 450_000, "hot_low_watermark": 250_000}}
    )
    plan = run_tiering(vault, dry_run=True)
    assert plan.by_watermark == [r.id for r, _ in saved[:4]]  # oldest first, to <= low
    run_tiering(vault)
    assert _tiers(vault, "ns", saved) == ["cold"] * 4 + ["hot"] * 2
    assert vault.stats().tiers["hot"].bytes <= 250_000
    assert run_tiering(vault, dry_run=True).by_watermark == []  # below the high mark now
    for rec, data in saved:
        assert read_file(vault, "ns", rec.id, "w") == data


def test_namespace_watermark_bounds_that_namespace_and_rules_win(vault: Vault) -> None:
    big = _save_days(vault, "big", 5, size=100_000)
    small = _save_days(vault, "small", 2, size=100_000)
    vault.set_policy(
        "big",
        {
            "tiering": {
                "target": "cold",
                "demote_after": "30d",
                "keep_hot_last": 2,
                "hot_high_watermark": "100KiB",
            }
        },
    )
    vault.set_policy("small", {"tiering": {"target": "cold", "demote_after": "30d"}})
    vault.lifecycle.patch("big", big[0][0].id, pinned=True)
    run_tiering(vault)
    # pinned and the newest two stay hot although the namespace stays over its mark
    assert _tiers(vault, "big", big) == ["hot", "cold", "cold", "hot", "hot"]
    assert _tiers(vault, "small", small) == ["hot", "hot"]  # another namespace's budget


def test_tiering_policy_keys_are_checked_when_set(vault: Vault) -> None:
    stream_save(vault, "ns", {"w": b"x"})
    for bad in (
        {"hot_high_watermark": "lots"},
        {"promote_on_read": "yes"},
        {"demote_after": "soon"},
        {"keep_hot_last": -1},
        {"target": 3},
        {"colder": True},
        {"hot_high_watermark": 10, "hot_low_watermark": 20},
    ):
        with pytest.raises(InvalidRequest):
            vault.set_policy("ns", {"tiering": bad})
    assert vault.policy("ns").tiering == {}
