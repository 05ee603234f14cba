"""Repacking after GC: sparse packs are rewritten with only their live frames, packs nothing
points to are deleted, and every checkpoint still reads back."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.tiering import MemoryTier
from checkpoint_vault.tiering.repack import plan, repack
from checkpoint_vault.tiering.runner import run_tiering
from checkpoint_vault.vault import FakeClock, Vault, VaultConfig
from checkpoint_vault.vault.content.packs import PackBuilder, upload
from checkpoint_vault.vault.frame import Encoder, chunk_id

from ..vault.helpers import read_file, stream_save


@pytest.fixture
def cold() -> MemoryTier:
    return MemoryTier("cold")


@pytest.fixture
def vault(tmp_path: Path, cold: MemoryTier) -> Iterator[Vault]:
    v = Vault(tmp_path / "v", VaultConfig(gc_grace=0.0), FakeClock(), tiers={"cold": cold})
    yield v
    v.close()


def _packs(tier: MemoryTier) -> list[str]:
    return sorted(k for k in tier.list("packs/") if not k.endswith(".idx"))


def test_gc_then_repack_keeps_only_live_bytes(vault: Vault, cold: MemoryTier) -> None:
    rng = random.Random(5)
    saved = [
        (stream_save(vault, "ns", {"w": d}), d) for d in (rng.randbytes(150_000) for _ in range(4))
    ]
    vault.set_policy("ns", {"tiering": {"target": "cold", "keep_hot_last": 0}})
    run_tiering(vault)
    (old_pack,) = _packs(cold)
    for rec, _ in saved[:3]:
        vault.lifecycle.delete("ns", rec.id)
    vault.store.clock.advance(7 * 3600)  # type: ignore[attr-defined]  # past the upload TTL
    assert vault.gc().chunks_deleted > 0
    (sparse,) = plan(vault)
    assert sparse.live_bytes < 0.3 * sparse.size
    report = repack(vault)
    assert (report.rewritten, report.deleted, report.new_packs) == (1, 1, 1)
    (new_pack,) = _packs(cold)
    assert new_pack != old_pack
    assert len(cold.get(new_pack)) == vault.stats().tiers["cold"].bytes
    assert report.dead_bytes_freed == sparse.size - sparse.live_bytes
    rec, data = saved[3]
    assert read_file(vault, "ns", rec.id, "w") == data
    assert plan(vault) == []  # nothing sparse left
    assert vault.check().ok
    assert vault.verify().corrupt == []


def test_unreferenced_packs_left_by_a_crash_are_deleted(vault: Vault, cold: MemoryTier) -> None:
    data = random.Random(6).randbytes(100_000)
    rec = stream_save(vault, "ns", {"w": data})
    vault.set_policy("ns", {"tiering": {"target": "cold", "keep_hot_last": 0}})
    run_tiering(vault)
    stray = PackBuilder()  # uploaded, then the process died before the switch
    stray.add(chunk_id(b"never switched"), Encoder().encode(b"never switched"))
    upload(cold, stray)
    assert len(_packs(cold)) == 2
    report = repack(vault)
    assert (report.deleted, report.rewritten) == (1, 0)
    assert len(_packs(cold)) == 1
    assert f"packs/{stray.pack_id}.idx" not in set(cold.list(""))
    assert read_file(vault, "ns", rec.id, "w") == data


def test_promotion_leaves_dead_bytes_that_a_tiering_run_repacks(
    vault: Vault, cold: MemoryTier
) -> None:
    rng = random.Random(7)
    saved = [
        (stream_save(vault, "ns", {"w": d}), d) for d in (rng.randbytes(120_000) for _ in range(3))
    ]
    vault.set_policy("ns", {"tiering": {"target": "cold", "keep_hot_last": 0}})
    run_tiering(vault)
    vault.set_policy("ns", {"tiering": {"keep_hot_last": 2}})  # two come back hot
    done = run_tiering(vault)
    assert done.promoted is not None
    assert done.promoted.chunks > 0
    assert done.repack.rewritten == 1  # a third of the pack is live
    assert [vault.get("ns", r.id).tier for r, _ in saved] == ["cold", "hot", "hot"]
    for rec, data in saved:
        assert read_file(vault, "ns", rec.id, "w") == data
    stats = vault.stats()
    assert stats.tiers["cold"].bytes == sum(len(cold.get(k)) for k in _packs(cold))
