"""The shared tier's GC across nodes (vault/content/sharedgc.py) on a memory tier whose
clock (the store's, which the grace is counted in) the test moves: two vaults, shards 0
and 1 of one cluster. SeaweedFS and real shard processes: tests/integration/
test_cluster_shared_gc.py."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.maintenance.tasks import gc
from checkpoint_vault.protocol import GcReport
from checkpoint_vault.tiering import MemoryTier
from checkpoint_vault.vault import Vault
from checkpoint_vault.vault.content.sharedgc import (
    CLAIM,
    Condemned,
    Mark,
    Sweeper,
    newest_generation,
    publish_mark,
)
from checkpoint_vault.vault.frame import chunk_id

from ..vault.helpers import client_save, read_file
from .shared_pair import StoreClock, vault_pair

pytestmark = pytest.mark.slow  # 1-3 s each: two vaults, several GC runs

GRACE = 60.0


@pytest.fixture
def store_clock() -> StoreClock:
    return StoreClock(GRACE)


@pytest.fixture
def tier(store_clock: StoreClock) -> MemoryTier:
    return MemoryTier("shared", clock=store_clock)


@pytest.fixture
def pair(tmp_path: Path, tier: MemoryTier) -> Iterator[tuple[Vault, Vault]]:
    with vault_pair(tmp_path, tier, shared_gc_grace=GRACE) as vaults:
        yield vaults


def _ids(vault: Vault, ns: str, ref: str) -> list[bytes]:
    _, files = vault.manifest(ns, ref)
    return [c for f in files.values() for c, _ in f.chunks]


def _packs(tier: MemoryTier) -> set[str]:
    return {k for k in tier.list("packs/") if not k.endswith(".idx")}


def _data(tier: MemoryTier) -> int:
    """Bytes of packs and segments: what the GC's own small objects are not."""
    return sum(tier.head(k) or 0 for k in tier.list("") if not k.startswith("gc/"))


def _gc_both(a: Vault, b: Vault) -> tuple[GcReport, GcReport]:
    """GC on both, once the chunks' reservations by the saves' sessions lapsed."""
    for v in (a, b):
        v.store.clock.advance(7 * 3600)  # type: ignore[attr-defined]
    return gc(a), gc(b)


def _gate(v: Vault) -> Condemned:
    assert v.store.shared is not None
    gate = v.store.shared.gate
    assert isinstance(gate, Condemned)
    return gate


def test_a_pack_goes_after_the_grace_only_once_no_shard_names_it(
    pair: tuple[Vault, Vault], tier: MemoryTier, store_clock: StoreClock
) -> None:
    a, b = pair
    data = random.Random(1).randbytes(300_000)
    first = client_save(a, "ns-a", {"w": data})
    a.content.demote("shared", _ids(a, "ns-a", first.id))
    second = client_save(b, "ns-b", {"w": data})  # adopts a's chunks: sends nothing
    packs = _packs(tier)
    assert packs

    a.delete_many("ns-a")
    for _ in range(3):  # A's catalog names nothing; B's still names every pack
        ra, rb = _gc_both(a, b)
        store_clock.pass_grace()
    assert ra.shared_packs_marked == 0
    assert rb.shared_packs_marked == len(packs)
    assert ra.shared_packs_deleted == rb.shared_packs_deleted == 0
    assert _packs(tier) == packs
    assert read_file(b, "ns-b", second.id, "w") == data

    b.delete_many("ns-b")
    ra, rb = _gc_both(a, b)  # phase 1: B's sweep finds no mark naming them
    assert rb.shared_packs_condemned == len(packs)
    gen = newest_generation(b.store.shared)  # type: ignore[arg-type]
    assert gen is not None
    assert gen.packs == packs

    ra, rb = _gc_both(a, b)  # marks acking the generation, but inside the grace
    assert ra.shared_packs_deleted == rb.shared_packs_deleted == 0
    assert rb.shared_waiting is not None
    assert "grace" in rb.shared_waiting
    assert _packs(tier) == packs

    store_clock.pass_grace()
    ra, rb = _gc_both(a, b)  # A sweeps before B's mark past the grace, B after it
    assert ra.shared_packs_deleted == 0
    assert ra.shared_waiting is not None
    assert "shard 1" in ra.shared_waiting
    assert rb.shared_packs_deleted == len(packs)
    assert rb.shared_bytes_freed
    assert rb.shared_bytes_freed >= len(data)
    assert _packs(tier) == set()
    assert _data(tier) == 0  # every segment and pack index went too
    assert len(b.store.shared or []) == 0  # and B's index forgot them


def test_a_chunk_in_a_condemned_pack_is_sent_again_and_a_named_pack_is_released(
    pair: tuple[Vault, Vault], tier: MemoryTier, store_clock: StoreClock
) -> None:
    a, b = pair
    data = random.Random(2).randbytes(200_000)
    first = client_save(a, "ns-a", {"w": data})
    a.content.demote("shared", _ids(a, "ns-a", first.id))
    packs = _packs(tier)
    a.delete_many("ns-a")
    _gc_both(a, b)
    store_clock.pass_grace()
    _, rb = _gc_both(a, b)
    assert rb.shared_packs_condemned == len(packs)

    # B with the condemned view: asks for every chunk rather than adopting a doomed copy
    _gate(b).refresh()
    ids = [chunk_id(data[i : i + 1000]).hex() for i in range(0, len(data), 1000)]
    session, _ = b.open_upload("ns-b")
    assert len(b.uploads.missing(session.id, ids)) == len(ids)

    # A took some before its view knew (inside the grace / 4 a view may be old): its
    # next mark names the pack, which the sweep then releases instead of deleting
    assert _gate(a).applied < rb.shared_packs_condemned  # A marked before B condemned
    session, _ = a.open_upload("ns-a")
    assert a.uploads.missing(session.id, ids) == []
    second = client_save(a, "ns-a", {"w": data})
    store_clock.pass_grace()
    ra, rb = _gc_both(a, b)
    deleted = (ra.shared_packs_deleted or 0) + (rb.shared_packs_deleted or 0)
    assert deleted == 0
    assert _packs(tier) == packs
    gen = newest_generation(a.store.shared)  # type: ignore[arg-type]
    assert gen is not None
    assert gen.packs == frozenset()  # released
    assert read_file(a, "ns-a", second.id, "w") == data
    _gate(b).refresh()  # and found again by B's lookups
    session, _ = b.open_upload("ns-b")
    assert b.uploads.missing(session.id, ids) == []


def test_a_shard_without_a_mark_or_with_a_newer_owner_blocks_every_delete(
    pair: tuple[Vault, Vault], tier: MemoryTier, store_clock: StoreClock
) -> None:
    a, b = pair
    data = random.Random(3).randbytes(100_000)
    first = client_save(a, "ns-a", {"w": data})
    a.content.demote("shared", _ids(a, "ns-a", first.id))
    packs = _packs(tier)
    a.delete_many("ns-a")
    for _ in range(3):  # shard 1 (B) never marks
        a.store.clock.advance(7 * 3600)  # type: ignore[attr-defined]
        assert gc(a).shared_waiting == "no mark from shard 1 yet"
        store_clock.pass_grace()
    assert _packs(tier) == packs

    b.store.clock.advance(7 * 3600)  # type: ignore[attr-defined]
    gc(b)  # condemned
    store_clock.pass_grace()
    # shard 1 taken over at a newer epoch: its owner claimed it, has not marked yet
    claim = Mark(1, 7, "c-s1", CLAIM, frozenset())
    tier.put(claim.key, claim.encode(), if_absent=True)
    assert gc(a).shared_waiting == "no mark from shard 1 yet"
    # the old owner's marks (epoch 0) no longer count
    assert gc(b).shared_waiting == "no mark from shard 1 yet"
    assert _packs(tier) == packs


def test_two_sweepers_and_a_sweeper_killed_mid_delete_leave_one_outcome(
    pair: tuple[Vault, Vault], tier: MemoryTier, store_clock: StoreClock
) -> None:
    a, b = pair
    for seed in (4, 5):  # two packs' worth
        data = random.Random(seed).randbytes(150_000)
        ckpt = client_save(a, "ns-a", {"w": data})
        a.content.demote("shared", _ids(a, "ns-a", ckpt.id))
    packs = _packs(tier)
    assert len(packs) >= 2
    a.delete_many("ns-a")
    _gc_both(a, b)
    store_clock.pass_grace()
    _gc_both(a, b)  # condemned
    store_clock.pass_grace()
    for v in (a, b):  # both mark past the grace; nobody has swept yet
        assert publish_mark(v.store, _gate(v), 0) is not None
    # a sweeper killed after one segment's delete, before its pack's
    shared = b.store.shared
    assert shared is not None
    tier.delete(next(iter(shared.segments())))
    # two sweepers, one after the other on the same marks: the second finds it done
    reports = [Sweeper(v.store.shared, 2, GRACE).sweep() for v in (a, b)]  # type: ignore[arg-type]
    assert [r.deleted for r in reports] == [len(packs), 0]
    assert reports[0].generation == reports[1].generation
    assert _packs(tier) == set()
    assert _data(tier) == 0
