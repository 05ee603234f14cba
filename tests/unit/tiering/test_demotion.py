"""Demotion to a tier (memory here; SeaweedFS in the integration tests): chunks leave the
hot store, reads come from packs, records say where their bytes are."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from checkpoint_vault.tiering import MemoryTier
from checkpoint_vault.tiering.runner import run_tiering
from checkpoint_vault.tiering.wrappers import FaultyTier
from checkpoint_vault.vault import FakeClock, MaintenanceStopped, Vault, VaultConfig
from checkpoint_vault.vault.content import moves
from checkpoint_vault.vault.errors import TierUnavailable

from ..vault.helpers import StopAfter, read_file, stream_save


@pytest.fixture
def cold() -> FaultyTier:
    return FaultyTier(MemoryTier("cold"))


@pytest.fixture
def tiered(tmp_path: Path, cold: FaultyTier) -> Vault:
    vault = Vault(tmp_path / "v", VaultConfig(gc_grace=0.0), FakeClock(), tiers={"cold": cold})
    yield vault  # type: ignore[misc]
    vault.close()


def test_old_checkpoints_move_and_read_back(tiered: Vault, cold: FaultyTier) -> None:
    rng = random.Random(3)
    shared = rng.randbytes(300_000)
    old = [stream_save(tiered, "ns", {"w": shared + rng.randbytes(100_000)}) for _ in range(3)]
    tiered.store.clock.advance(8 * 86400)  # type: ignore[attr-defined]
    new = stream_save(tiered, "ns", {"w": shared + rng.randbytes(100_000)})
    tiered.set_policy(
        "ns", {"tiering": {"target": "cold", "demote_after": "7d", "keep_hot_last": 1}}
    )
    plan = run_tiering(tiered, dry_run=True)
    assert sorted(plan.tiers["cold"].checkpoints) == sorted(r.id for r in old)
    frames_before = tiered.stats().chunks
    result = run_tiering(tiered)
    assert result.moved is not None
    moved = result.moved["cold"]
    assert moved.chunks > 0
    assert moved.packs >= 1
    assert {tiered.get("ns", r.id).tier for r in old} == {"mixed"}  # `shared` stays hot
    assert tiered.get("ns", new.id).tier == "hot"  # shares `shared` chunks: they stay hot
    stats = tiered.stats()
    assert stats.chunks == frames_before  # moved, not copied or lost
    assert stats.tiers["cold"].chunks == moved.chunks
    assert stats.tiers["hot"].chunks + stats.tiers["cold"].chunks == stats.chunks
    assert stats.tiers["hot"].bytes + stats.tiers["cold"].bytes == stats.stored_bytes
    for rec in old:
        _, files = tiered.manifest("ns", rec.id)
        assert read_file(tiered, "ns", rec.id, "w") == b"".join(
            tiered.reader.chunks([c for c, _ in files["w"].chunks])
        )
    assert tiered.check().ok
    assert tiered.check().orphan_frames == 0
    assert tiered.verify().corrupt == []


def test_reads_of_cold_chunks_during_an_outage_are_unavailable(
    tiered: Vault, cold: FaultyTier
) -> None:
    data = random.Random(4).randbytes(200_000)
    rec = stream_save(tiered, "ns", {"w": data})
    _, files = tiered.manifest("ns", rec.id)
    tiered.content.demote("cold", [c for c, _ in files["w"].chunks])
    cold.fail_next = 1_000
    with pytest.raises(TierUnavailable):
        read_file(tiered, "ns", rec.id, "w")
    cold.fail_next = 0
    assert read_file(tiered, "ns", rec.id, "w") == data
    assert tiered.check().ok


def test_corrupt_pack_bytes_are_detected_and_healed_by_upload(
    tiered: Vault, cold: FaultyTier
) -> None:
    data = random.Random(5).randbytes(150_000)
    rec = stream_save(tiered, "ns", {"w": data})
    _, files = tiered.manifest("ns", rec.id)
    tiered.content.demote("cold", [c for c, _ in files["w"].chunks])
    cold.corrupt_reads = True
    report = tiered.verify()
    assert len(report.corrupt) == len({c for c, _ in files["w"].chunks})
    assert report.checkpoints_invalidated == [rec.id]
    cold.corrupt_reads = False
    again = stream_save(tiered, "ns", {"w": data})  # the same bytes: heal into the hot store
    assert tiered.verify().checkpoints_healed == [rec.id]
    assert read_file(tiered, "ns", rec.id, "w") == data
    assert again.id != rec.id


class Crash(Exception):
    """Stands for the process dying at this point: nothing after it runs."""


def test_a_crash_at_either_step_of_a_move_loses_nothing(
    tiered: Vault, cold: FaultyTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = random.Random(8).randbytes(400_000)
    rec = stream_save(tiered, "ns", {"w": data})
    _, files = tiered.manifest("ns", rec.id)
    chunks = [c for c, _ in files["w"].chunks]
    writer = tiered.store.writer
    real_run = writer.run

    # 1. Dies after the pack is uploaded, before the catalog switches: a dead pack in the
    #    tier, every chunk still hot.
    def crash_before_switch(op: object, size: int = 0, local: bool = False) -> object:
        raise Crash

    monkeypatch.setattr(writer, "run", crash_before_switch)
    with pytest.raises(Crash):
        tiered.content.demote("cold", chunks)
    monkeypatch.setattr(writer, "run", real_run)
    assert any(k.startswith("packs/") for k in cold.list())
    assert tiered.get("ns", rec.id).tier == "hot"
    assert read_file(tiered, "ns", rec.id, "w") == data
    assert tiered.check().ok

    # 2. Dies after the switch, before the hot frames are dropped: reads come from the
    #    pack; the old frames are unnamed, and repair drops them.
    calls = {"n": 0}

    def crash_after_switch(op: object, size: int = 0, local: bool = False) -> object:
        calls["n"] += 1
        if calls["n"] == 2:
            raise Crash
        return real_run(op, size, local=local)  # type: ignore[arg-type]

    monkeypatch.setattr(writer, "run", crash_after_switch)
    with pytest.raises(Crash):
        tiered.content.demote("cold", chunks)
    monkeypatch.setattr(writer, "run", real_run)
    cold.fail_next = 0
    report = tiered.check()
    assert report.ok
    assert report.orphan_frames == len(set(chunks))
    assert read_file(tiered, "ns", rec.id, "w") == data
    assert tiered.check(repair=True).repaired == len(set(chunks))
    assert tiered.check().orphan_frames == 0
    assert read_file(tiered, "ns", rec.id, "w") == data


def test_a_demotion_stops_between_batches_when_the_server_stops(
    tiered: Vault, cold: FaultyTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM during a tiering run: the batches before it moved and read back from their
    packs, the rest is still hot, nothing half moved; the next run moves the rest."""
    monkeypatch.setattr(moves, "READ_BATCH", 1)  # a batch per chunk
    data = random.Random(5).randbytes(900_000)
    rec = stream_save(tiered, "ns", {"w": data})
    _, files = tiered.manifest("ns", rec.id)
    chunks = [c for c, _ in files["w"].chunks]
    assert len(chunks) >= 4
    with pytest.raises(MaintenanceStopped):
        tiered.content.demote("cold", chunks, pack_target=1, stop=StopAfter(2))
    stats = tiered.stats()
    assert stats.tiers["cold"].chunks == 2
    assert stats.tiers["hot"].chunks == len(set(chunks)) - 2
    assert read_file(tiered, "ns", rec.id, "w") == data
    assert tiered.check().ok
    tiered.content.demote("cold", chunks)
    assert tiered.stats().tiers["cold"].chunks == len(set(chunks))
    assert read_file(tiered, "ns", rec.id, "w") == data
    assert tiered.check().ok
