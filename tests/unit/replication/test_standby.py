"""The engine's standby and fencing (vault/replication/follow.py, layout.py) over a file tier:
a standby follows and refuses writes, rebuilds on a new generation and after a crash
mid-apply, and a promotion fences the old primary, whose later segments no reader follows.
The same over real processes and SeaweedFS is tests/fault/test_standby.py."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from checkpoint_vault.protocol import ReplicationStatus, StandbyStatus
from checkpoint_vault.tiering.backends.local import LocalTier
from checkpoint_vault.tiering.wrappers import FaultyTier
from checkpoint_vault.vault import Conflict, Vault
from checkpoint_vault.vault.errors import (
    Fenced,
    PromotionConflict,
    ReadOnlyStandby,
    ReplicaNotFound,
)
from checkpoint_vault.vault.replication import FollowConfig, ReplicationConfig, restore_replica
from checkpoint_vault.vault.replication.apply import frame_runs
from checkpoint_vault.vault.replication.changes import CATALOG, DELETE, FRAMES, PUT, BatchLog
from checkpoint_vault.vault.replication.follow import POSITION
from checkpoint_vault.vault.replication.layout import (
    EPOCH_FILE,
    Current,
    claim_epoch,
    epoch_of,
    fence_key,
    new_generation,
    newest_epoch,
    read_current,
    replica_current,
    segment_key,
    write_current,
)
from checkpoint_vault.vault.tier import Tier

from ..vault.helpers import client_save, read_file

DEADLINE = 20.0  # seconds any wait for the replica or the standby may take
POLL = 0.02  # the standby's poll interval here


def standby_of(vault: Vault) -> StandbyStatus:
    """The standby status in `vault`'s stats (it is a standby)."""
    status = vault.stats().standby
    assert status is not None
    return status


def replication_of(vault: Vault) -> ReplicationStatus:
    """The replication status in `vault`'s stats (it replicates)."""
    status = vault.stats().replication
    assert status is not None
    return status


def wait_for(ok: Callable[[], bool], what: str) -> None:
    """Poll observable state, bounded by DEADLINE."""
    deadline = time.monotonic() + DEADLINE
    while not ok():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def primary(path: Path, tier: Tier, mode: str = "async") -> Vault:
    return Vault(path, tiers={"cold": tier}, replication=ReplicationConfig("cold", mode))


def standby(path: Path, tier: Tier, mode: str = "async") -> Vault:
    return Vault(
        path,
        tiers={"cold": tier},
        replication=ReplicationConfig("cold", mode),
        follow=FollowConfig("cold", POLL),
    )


def caught_up(vault: Vault) -> None:
    assert vault.roles.replication is not None
    assert vault.roles.replication.wait_restorable(DEADLINE), vault.roles.replication.status()


def ids(vault: Vault, ns: str = "ns") -> set[str]:
    return {r.id for r in vault.checkpoints(ns, limit=1000)[0]}


@pytest.fixture
def tier(tmp_path: Path) -> LocalTier:
    return LocalTier(str(tmp_path / "tier"), "cold")


@pytest.fixture
def pair(tmp_path: Path, tier: LocalTier) -> Iterator[tuple[Vault, Vault]]:
    """A primary with one checkpoint in the replica, and a standby of it (tests may close
    either first: closing is idempotent)."""
    p = primary(tmp_path / "primary", tier)
    s: Vault | None = None
    try:
        client_save(p, "ns", {"a": b"first"})
        caught_up(p)
        s = standby(tmp_path / "standby", tier)
        yield p, s
    finally:
        if s is not None:
            s.close()
        p.close()


def test_standby_follows_reads_and_refuses_writes(pair: tuple[Vault, Vault]) -> None:
    p, s = pair
    assert s.roles.role == "standby"
    assert ids(s) == ids(p)
    files = {"w.bin": os.urandom(30_000), "m.json": b"{}"}
    rec = client_save(p, "ns", files)
    p.tokens.create("reader", ["read:*"])
    wait_for(lambda: rec.id in ids(s), "the standby to show the new checkpoint")
    for name, data in files.items():
        assert read_file(s, "ns", rec.id, name) == data
    wait_for(lambda: "reader" in {t.name for t in s.tokens.all()}, "the token")
    p.lifecycle.delete("ns", rec.id)
    wait_for(lambda: rec.id not in ids(s), "the delete to reach the standby")
    before = s.stats()
    with pytest.raises(ReadOnlyStandby):
        client_save(s, "ns", {"a": b"nope"})
    with pytest.raises(ReadOnlyStandby):
        s.set_policy("ns", {"retention": {"keep_last": 1}})
    after = s.stats()
    assert (after.checkpoints, after.chunks) == (before.checkpoints, before.chunks)
    wait_for(lambda: standby_of(s).batches > 0, "the log's batches to be counted")
    status = standby_of(s)
    assert status.epoch == 0
    assert status.lag_seconds is not None
    assert s.check().ok


def test_promotion_fences_the_old_primary(pair: tuple[Vault, Vault], tier: LocalTier) -> None:
    p, s = pair
    acked = client_save(p, "ns", {"a": b"before"}).id
    caught_up(p)
    out = s.roles.promote()
    assert (out.epoch, out.role, s.roles.role) == (1, "primary", "primary")
    assert tier.head(fence_key(1)) is not None
    assert json.loads((s.path / EPOCH_FILE).read_text())["epoch"] == 1
    assert not (s.path / POSITION).exists()
    assert acked in ids(s)  # everything restorable before the promotion is there
    # The old primary's next check meets the fence: it stops, and refuses from then on. A
    # save in between (async) is acknowledged from its local disk, and never replicated.
    late: set[str] = set()
    with contextlib.suppress(Fenced):
        late.add(client_save(p, "ns", {"a": b"after the fence"}).id)
    wait_for(lambda: p.roles.role == "fenced", "the old primary to find the fence")
    with pytest.raises(Fenced):
        client_save(p, "ns", {"a": b"refused"})
    assert replication_of(p).fenced_by == 1
    new = client_save(s, "ns", {"a": b"on the new primary"}).id
    caught_up(s)
    restored = Vault(_restored(tier, s.path.parent / "restored"))
    try:
        assert ids(restored) == ids(s)
        assert new in ids(restored)
        assert not late & ids(restored)
        assert restored.check().ok
    finally:
        restored.close()


def test_sync_commit_meeting_the_fence_fails(tmp_path: Path, tier: LocalTier) -> None:
    p = primary(tmp_path / "primary", tier, mode="sync")
    try:
        client_save(p, "ns", {"a": b"one"})
        s = standby(tmp_path / "standby", tier)
        try:
            s.roles.promote()
            with pytest.raises(Fenced):  # committed locally, never acknowledged
                client_save(p, "ns", {"a": b"two"})
            assert p.roles.role == "fenced"
        finally:
            s.close()
    finally:
        p.close()


class BlindTier:
    """The old primary's view in the race: it checked before the fence was written, so it
    does not see it (head of a fence answers None) and ships on."""

    def __init__(self, inner: Tier) -> None:
        self.name = inner.name
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def head(self, key: str) -> int | None:
        return None if key.startswith("replica/fence/") else self._inner.head(key)


def test_segments_past_the_fence_point_are_never_read(tmp_path: Path, tier: LocalTier) -> None:
    p = primary(tmp_path / "primary", BlindTier(tier))  # type: ignore[arg-type]
    try:
        client_save(p, "ns", {"a": b"one"})
        caught_up(p)
        s = standby(tmp_path / "standby", tier)
        other = standby(tmp_path / "other", tier)  # a second standby follows the promotion
        try:
            s.roles.promote()
            fence = read_current(tier, 1)
            assert fence is not None
            assert fence.end_segment is not None
            stale = {client_save(p, "ns", {"a": os.urandom(2000)}).id for _ in range(3)}
            caught_up(p)  # its segments are in the store, past the fence point
            assert p.roles.role == "primary"  # blind: it never saw the fence
            restored = Vault(_restored(tier, tmp_path / "restored"))
            try:
                assert not stale & ids(restored)
            finally:
                restored.close()
            new = client_save(s, "ns", {"a": b"new primary"}).id
            caught_up(s)
            wait_for(
                lambda: standby_of(other).epoch == 1 and new in ids(other),
                "the second standby to follow epoch 1",
            )
            assert not stale & ids(other)
        finally:
            other.close()
            s.close()
    finally:
        p.close()


def test_old_primary_coming_back_is_fenced(pair: tuple[Vault, Vault], tier: LocalTier) -> None:
    p, s = pair
    s.roles.promote()
    p.close()  # stopped cleanly before it shipped again: it never saw the fence
    with contextlib.closing(primary(p.path, tier)) as again:
        assert again.roles.role == "fenced"
        with pytest.raises(Fenced):
            client_save(again, "ns", {"a": b"x"})


class RivalTier(BlindTier):
    """A rival promotion claims epoch 1 just before this standby's conditional put."""

    def put(self, key: str, data: bytes | memoryview, *, if_absent: bool = False) -> None:
        if key == fence_key(1):
            self._inner.put(key, b"{}", if_absent=True)
        self._inner.put(key, data, if_absent=if_absent)


def test_two_promotions_cannot_claim_one_epoch(
    pair: tuple[Vault, Vault], tmp_path: Path, tier: LocalTier
) -> None:
    s = standby(tmp_path / "loser", RivalTier(tier))  # type: ignore[arg-type]
    try:
        with pytest.raises(PromotionConflict):
            s.roles.promote()
        assert s.roles.role == "standby"
        with pytest.raises(ReadOnlyStandby):
            client_save(s, "ns", {"a": b"still a standby"})
    finally:
        s.close()


def test_a_promotion_that_died_does_not_block_the_next(
    pair: tuple[Vault, Vault], tier: LocalTier
) -> None:
    p, s = pair
    tier.put(fence_key(1), b"{}", if_absent=True)  # claimed, then its server died
    wait_for(lambda: p.roles.role == "fenced" or _saved_fenced(p), "the claim to fence the primary")
    assert s.roles.promote().epoch == 2
    assert read_current(tier, 2) is not None
    client_save(s, "ns", {"a": b"the next promotion"})


def _saved_fenced(vault: Vault) -> bool:
    """Save once: False if it went through, True if it met the fence."""
    try:
        client_save(vault, "ns", {"a": os.urandom(100)})
    except Fenced:
        return True
    return False


def test_new_generation_rebuilds_the_standby(pair: tuple[Vault, Vault], tier: LocalTier) -> None:
    p, s = pair
    p.close()
    (p.path / "replica.resume").unlink()  # as after a SIGKILL: the next start begins anew
    with contextlib.closing(primary(p.path, tier)) as p2:
        rec = client_save(p2, "ns", {"a": b"new generation"})
        caught_up(p2)
        gen = replication_of(p2).generation
        wait_for(
            lambda: standby_of(s).generation == gen and rec.id in ids(s),
            "the standby to rebuild on the new generation",
        )
        assert standby_of(s).rebases >= 2  # the first sync, then this one
        assert read_file(s, "ns", rec.id, "a") == b"new generation"
        assert s.check().ok


@pytest.mark.slow
def test_overflow_on_the_primary_rebuilds_the_standby(tmp_path: Path, tier: LocalTier) -> None:
    faulty = FaultyTier(tier)
    config = ReplicationConfig("cold", max_backlog=20_000)
    with contextlib.closing(Vault(tmp_path / "p", tiers={"cold": faulty}, replication=config)) as p:
        client_save(p, "ns", {"a": b"one"})
        caught_up(p)
        with contextlib.closing(standby(tmp_path / "s", tier)) as s:
            faulty.fail_next = 10**9  # the store is down for the primary only
            dropped = {client_save(p, "ns", {"a": os.urandom(9000)}).id for _ in range(4)}
            assert replication_of(p).overflows >= 1
            faulty.fail_next = 0
            caught_up(p)  # a new generation's base holds what the queue dropped
            wait_for(
                lambda: standby_of(s).rebases >= 2 and dropped <= ids(s),
                "the standby to rebuild from the new base",
            )
            assert ids(s) == ids(p)


def test_crash_mid_apply_rebuilds_at_start(
    pair: tuple[Vault, Vault], tmp_path: Path, tier: LocalTier
) -> None:
    p, _ = pair
    path = tmp_path / "crashed"
    s = standby(path, tier)
    rec = client_save(p, "ns", {"a": b"two"})
    wait_for(lambda: rec.id in ids(s), "the standby")
    s.close()
    position = json.loads((path / POSITION).read_text())
    (path / POSITION).write_text(json.dumps({**position, "applying": True}))  # killed mid-way
    again = standby(path, tier)
    try:
        assert standby_of(again).rebases == 1
        assert ids(again) == ids(p)
        assert again.check().ok
    finally:
        again.close()
    with pytest.raises(Conflict, match="standby"):  # never a primary but by promotion
        primary(path, tier)


def _restored(tier: Tier, where: Path) -> Path:
    restore_replica(tier, where)
    return where


def test_runs_end_before_a_reused_frame_number() -> None:
    """A frame deleted and later put again under the same number (a primary restarted on a
    clean close numbers after the last frame left) must not lose its new put to the
    deferred delete: the run ends before the batch that puts it."""
    put = (FRAMES, PUT, 0, b"\x00" * 7 + b"\x09", b"frame")
    delete = (FRAMES, DELETE, 0, b"\x00" * 7 + b"\x09", b"")
    other = (CATALOG, PUT, 0, b"k", b"v")
    batches = [
        BatchLog(1, 0.0, [put, other]),
        BatchLog(2, 0.0, [delete, other]),
        BatchLog(3, 0.0, [other]),
        BatchLog(4, 0.0, [put]),
        BatchLog(5, 0.0, [delete]),
    ]
    assert [[b.number for b in run] for run in frame_runs(batches)] == [[1, 2, 3], [4, 5]]


def test_epochs_keys_and_the_pointer_a_restore_follows(tier: LocalTier) -> None:
    assert newest_epoch(tier) == 0
    with pytest.raises(ReplicaNotFound):
        replica_current(tier)
    write_current(tier, Current(0, new_generation(0), 3))
    claim_epoch(tier, 1, None)
    with pytest.raises(PromotionConflict):
        claim_epoch(tier, 1, None)  # conditional: one winner per epoch
    assert newest_epoch(tier) == 1
    assert replica_current(tier).epoch == 0  # epoch 1 claimed, its pointer not yet written
    gen = new_generation(1)
    write_current(tier, Current(1, gen, 0))
    assert (replica_current(tier).epoch, replica_current(tier).generation) == (1, gen)
    assert epoch_of(segment_key(gen, 5)) == 1
    assert epoch_of(segment_key(new_generation(0), 5)) == 0
    assert epoch_of(fence_key(1)) is None  # fences belong to no writer: never collected
    assert Current(1, gen, 0, end_segment=4).within(3)
    assert not Current(1, gen, 0, end_segment=4).within(4)
