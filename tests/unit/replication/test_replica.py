"""Engine-level replication: the log reaches a tier in order, a restore from it reads back
bit-identical, an outage grows the lag and the backlog catches up (file tier; the SeaweedFS
runs are in tests/fault/test_replication.py)."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from checkpoint_vault.protocol import ReplicationStatus
from checkpoint_vault.tiering.backends.local import LocalTier
from checkpoint_vault.tiering.backends.memory import MemoryTier
from checkpoint_vault.tiering.wrappers import FaultyTier
from checkpoint_vault.vault import Conflict, FakeClock, Vault, VaultConfig
from checkpoint_vault.vault.env import CATALOG_DBS, FRAME_DBS
from checkpoint_vault.vault.replication import ReplicationConfig, restore_replica
from checkpoint_vault.vault.tier import Tier

from ..vault.helpers import client_save, read_file

DEADLINE = 20.0  # seconds any wait for the replica may take


def replication_of(vault: Vault) -> ReplicationStatus:
    """The replication status in `vault`'s stats (it replicates)."""
    status = vault.stats().replication
    assert status is not None
    return status


def _open(path: Path, tier: Tier, **opts: object) -> Vault:
    config = ReplicationConfig(tier="cold", **opts)  # type: ignore[arg-type]
    return Vault(path, tiers={"cold": tier}, replication=config)


def _generations(tier: LocalTier | FaultyTier) -> set[str]:
    return {k.split("/")[1] for k in tier.list("replica/") if k != "replica/current"}


def _wait_caught_up(vault: Vault) -> None:
    assert vault.roles.replication is not None
    assert vault.roles.replication.wait_restorable(DEADLINE), vault.roles.replication.status()


def test_restore_reads_back_everything_committed(tmp_path: Path) -> None:
    tier = LocalTier(str(tmp_path / "tier"), "cold")
    rng = random.Random(7)
    vault = _open(tmp_path / "primary", tier)
    saved = {}
    try:
        vault.tokens.create("ci", ["write:*"])
        for i in range(12):
            files = {"w.bin": rng.randbytes(rng.randrange(1, 20_000)), "m.json": b"%d" % i}
            rec = client_save(vault, "ns", files)
            saved[rec.id] = files
        vault.set_policy("ns", {"retention": {"keep_last": 3}})
        deleted = next(iter(saved))
        vault.lifecycle.delete("ns", deleted)
        del saved[deleted]
        _wait_caught_up(vault)
        status = replication_of(vault)
        assert status.lag_seconds == 0.0
        assert status.lag_bytes == 0
    finally:
        vault.close()

    out = restore_replica(tier, tmp_path / "restored")
    assert out.batches > 0
    restored = Vault(tmp_path / "restored")
    try:
        listed = {r.id for r in restored.checkpoints("ns", limit=100)[0]}
        assert listed == set(saved)
        for cid, files in saved.items():
            for name, data in files.items():
                assert read_file(restored, "ns", cid, name) == data
        assert "ci" in [t.name for t in restored.tokens.all()]
        assert restored.policy("ns").retention.keep_last == 3
        assert restored.check().ok
    finally:
        restored.close()


@pytest.mark.slow
def test_outage_grows_lag_then_catches_up(tmp_path: Path) -> None:
    tier = FaultyTier(LocalTier(str(tmp_path / "tier"), "cold"))
    vault = _open(tmp_path / "primary", tier)
    try:
        client_save(vault, "ns", {"a": os.urandom(5000)})
        _wait_caught_up(vault)
        tier.fail_next = 10**9  # down
        ids = [client_save(vault, "ns", {"a": os.urandom(5000)}).id for _ in range(5)]
        assert vault.roles.replication is not None
        assert not vault.roles.replication.wait_restorable(0.3)
        status = replication_of(vault)
        assert status.lag_bytes > 0
        assert status.lag_seconds > 0.2
        assert status.failures > 0
        tier.fail_next = 0  # back
        _wait_caught_up(vault)
        assert replication_of(vault).lag_bytes == 0
    finally:
        vault.close()
    restore_replica(tier, tmp_path / "restored")
    restored = Vault(tmp_path / "restored")
    try:
        assert set(ids) <= {r.id for r in restored.checkpoints("ns", limit=100)[0]}
    finally:
        restored.close()


def test_overflow_drops_the_backlog_for_a_new_base(tmp_path: Path) -> None:
    tier = FaultyTier(LocalTier(str(tmp_path / "tier"), "cold"))
    vault = _open(tmp_path / "primary", tier, max_backlog=20_000)
    try:
        _wait_caught_up(vault)
        tier.fail_next = 10**9  # down
        ids = [client_save(vault, "ns", {"a": os.urandom(9000)}).id for _ in range(4)]
        assert vault.roles.replication is not None
        status = vault.roles.replication.status()
        assert status.overflows >= 1
        assert status.lag_bytes <= 20_000
        assert status.base_pending
        assert status.lag_seconds > 0
        tier.fail_next = 0
        _wait_caught_up(vault)
        # Older generations are deleted once a newer base is current, by the base thread
        # after the replica caught up (a few objects per idle turn): bounded by DEADLINE.
        deadline = time.monotonic() + DEADLINE
        while len(gens := _generations(tier)) > 1 and time.monotonic() < deadline:
            vault.roles.replication.wait_restorable(DEADLINE)  # paces on the shipper's lock
        assert len(gens) == 1, gens
    finally:
        vault.close()
    restore_replica(tier, tmp_path / "restored")
    restored = Vault(tmp_path / "restored")
    try:
        assert set(ids) == {r.id for r in restored.checkpoints("ns", limit=100)[0]}
    finally:
        restored.close()


def test_sync_acknowledges_once_replicated(tmp_path: Path) -> None:
    tier = LocalTier(str(tmp_path / "tier"), "cold")
    vault = _open(tmp_path / "primary", tier, mode="sync")
    try:
        assert vault.roles.replication is not None
        for _ in range(3):
            client_save(vault, "ns", {"a": os.urandom(3000)})
            status = vault.roles.replication.status()
            assert status.restorable_batch == status.batches
    finally:
        vault.close()


def test_point_in_time(tmp_path: Path) -> None:
    tier = LocalTier(str(tmp_path / "tier"), "cold")
    vault = _open(tmp_path / "primary", tier)
    try:
        _wait_caught_up(vault)  # the base first, so the saves below are all in the log
        first = client_save(vault, "ns", {"a": b"one"})
        _wait_caught_up(vault)
        cut = time.time()
        client_save(vault, "ns", {"a": b"two"})
        _wait_caught_up(vault)
    finally:
        vault.close()
    restore_replica(tier, tmp_path / "restored", until=cut)
    restored = Vault(tmp_path / "restored")
    try:
        assert [r.id for r in restored.checkpoints("ns", limit=10)[0]] == [first.id]
    finally:
        restored.close()


def test_restore_refuses_a_used_dir(tmp_path: Path) -> None:
    tier = LocalTier(str(tmp_path / "tier"), "cold")
    vault = _open(tmp_path / "primary", tier)
    _wait_caught_up(vault)
    vault.close()
    with pytest.raises(Conflict):
        restore_replica(tier, tmp_path / "primary")


def test_clean_restart_and_restore_continue_the_generation(tmp_path: Path) -> None:
    tier = LocalTier(str(tmp_path / "tier"), "cold")
    vault = _open(tmp_path / "primary", tier)
    a = client_save(vault, "ns", {"a": b"one"}).id
    _wait_caught_up(vault)
    assert vault.roles.replication is not None
    gen = vault.roles.replication.status().generation
    vault.close()
    vault = _open(tmp_path / "primary", tier)  # clean restart: same generation, no base
    b = client_save(vault, "ns", {"a": b"two"}).id
    _wait_caught_up(vault)
    assert vault.roles.replication is not None
    status = vault.roles.replication.status()
    assert (status.generation, status.bases) == (gen, 0)
    # the old primary is not closed: a restored copy that writes too must not share the log
    restore_replica(tier, tmp_path / "restored")
    restored = _open(tmp_path / "restored", tier)
    try:
        assert restored.roles.replication is not None
        assert restored.roles.replication.status().generation == gen  # continued after restore
        client_save(vault, "ns", {"a": b"three"})  # the old primary takes the next segment
        _wait_caught_up(vault)
        c = client_save(restored, "ns", {"a": b"four"}).id  # finds it taken: a new generation
        _wait_caught_up(restored)
        assert restored.roles.replication.status().generation != gen
    finally:
        restored.close()
        vault.close()
    restore_replica(tier, tmp_path / "again")
    again = Vault(tmp_path / "again")
    try:
        assert {r.id for r in again.checkpoints("ns", limit=10)[0]} == {a, b, c}
    finally:
        again.close()


def test_tables_keep_their_places_in_the_log() -> None:
    """A replication log names a table by its index in the environment's list, so a table
    added later goes last: a log written before it must still apply after it."""
    assert FRAME_DBS == (b"frames",)
    assert CATALOG_DBS[:23] == (
        b"chunkmeta", b"inline", b"packed", b"deltas", b"bases", b"compacted",
        b"checkpoints", b"manifests", b"entries", b"entryrefs", b"nsindex", b"tagindex",
        b"namespaces", b"uploads", b"uploadfiles", b"idempotency", b"tokens", b"policies",
        b"counters", b"nsrefs", b"uploadchunks", b"audit", b"keys",
    )  # fmt: skip


def test_a_log_of_frames_collected_since_the_base_gets_a_new_base(tmp_path: Path) -> None:
    """Frames gone from the vault (collected here; demoted to a tier in a cluster) stay in
    the replica's log until a base: one comes early once the log is mostly dead bytes
    (vault/replication/rebase.py), and the old log goes with the old base."""
    tier = MemoryTier("cold")  # a file tier lists the whole tree per call: slow to forget
    clock = FakeClock()
    vault = Vault(
        tmp_path / "primary",
        VaultConfig(gc_grace=0.0),
        clock,
        tiers={"cold": tier},
        replication=ReplicationConfig(tier="cold"),
    )

    def replica_bytes() -> int:
        return sum(tier.head(k) or 0 for k in tier.list("replica/"))

    try:
        data = random.Random(8).randbytes(4 << 20)  # random: the log cannot compress it
        rec = client_save(vault, "ns", {"w.bin": data}, chunk_size=256 << 10)
        _wait_caught_up(vault)
        assert replica_bytes() >= len(data)
        vault.lifecycle.delete("ns", rec.id)
        clock.advance(7 * 3600)  # past the upload session's reservation of its chunks
        assert vault.gc().chunks_deleted > 0
        _wait_caught_up(vault)
        deadline = time.monotonic() + DEADLINE
        while replica_bytes() > len(data) // 10 and time.monotonic() < deadline:
            time.sleep(0.05)  # polling the replica's objects, bounded by DEADLINE
        assert replica_bytes() <= len(data) // 10
        assert replication_of(vault).bases >= 1
    finally:
        vault.close()
