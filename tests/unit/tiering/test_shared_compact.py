"""Compaction of the shared index (vault/content/sharedcompact.py) on a memory tier whose
clock the test moves, inside the GC runs of two vaults (shards 0 and 1 of one cluster):
what a cold start fetches, and a sweep that dooms a pack of a merged segment."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.maintenance.tasks import gc
from checkpoint_vault.tiering import MemoryTier
from checkpoint_vault.vault import Vault
from checkpoint_vault.vault.content.shared import (
    INDEX_PREFIX,
    SharedIndex,
    decode_listing,
    encode_merged,
    encode_segment,
)
from checkpoint_vault.vault.content.sharedcompact import MIN_GRACE, compact
from checkpoint_vault.vault.content.sharedgc import Condemned
from checkpoint_vault.vault.errors import TierError

from ..vault.helpers import client_save, read_file
from .shared_pair import StoreClock, vault_pair

pytestmark = pytest.mark.slow  # ~1-3 s each: two vaults, many demotions and GC runs

GRACE = 600.0
FANIN = 4


@pytest.fixture
def store_clock() -> StoreClock:
    return StoreClock(GRACE)


@pytest.fixture
def tier(store_clock: StoreClock) -> MemoryTier:
    return MemoryTier("shared", clock=store_clock)


@pytest.fixture
def pair(tmp_path: Path, tier: MemoryTier) -> Iterator[tuple[Vault, Vault]]:
    with vault_pair(tmp_path, tier, shared_gc_grace=GRACE, shared_index_fanin=FANIN) as vaults:
        yield vaults


def _segments(tier: MemoryTier) -> list[str]:
    return [k for k in tier.list(INDEX_PREFIX) if k.endswith(".seg")]


def _packs(tier: MemoryTier) -> set[str]:
    return {k for k in tier.list("packs/") if not k.endswith(".idx")}


def _shipped(v: Vault, tier: MemoryTier, seed: int) -> tuple[str, bytes, set[str], list[bytes]]:
    """A checkpoint of fresh bytes demoted to the shared tier alone: its own pack."""
    data = random.Random(seed).randbytes(40_000)
    before = _packs(tier)
    ckpt = client_save(v, "ns", {"w": data})
    _, files = v.manifest("ns", ckpt.id)
    ids = [c for f in files.values() for c, _ in f.chunks]
    v.content.demote("shared", ids)
    return ckpt.id, data, _packs(tier) - before, ids


def _gc_both(a: Vault, b: Vault) -> None:
    for v in (a, b):
        v.store.clock.advance(7 * 3600)  # type: ignore[attr-defined]
        gc(v)


def _cold(tier: MemoryTier) -> SharedIndex:
    """Another process's view, from nothing."""
    index = SharedIndex(tier, "shared", "cold-s9")
    index.refresh()
    return index


def test_a_cold_start_fetches_merged_segments_and_finds_every_chunk(
    pair: tuple[Vault, Vault], tier: MemoryTier
) -> None:
    a, b = pair
    shipped = [_shipped(a, tier, seed) for seed in range(17)]
    assert len(_segments(tier)) == 17  # one per pack
    _gc_both(a, b)
    assert len(_segments(tier)) == 1  # level 0 had 4 or more: merged into one (level 2)
    shipped += [_shipped(a, tier, seed) for seed in range(17, 21)]
    _gc_both(a, b)
    assert len(_segments(tier)) == 2  # the four new ones merged (level 1); the 17 stay
    cold = _cold(tier)
    assert cold.segments_read == 2
    every = [c for *_, ids in shipped for c in ids]
    assert set(cold.lookup(every)) == set(every)
    assert len(_packs(tier)) == 21  # the packs themselves are untouched
    for ckpt, data, _, _ in shipped:
        assert read_file(a, "ns", ckpt, "w") == data
    # b found a's chunks through the merged segments: it sends nothing
    session, _ = b.open_upload("ns-b")
    assert b.uploads.missing(session.id, [c.hex() for c in every]) == []


def test_a_pack_doomed_inside_a_merged_segment_is_unlisted_before_it_goes(
    pair: tuple[Vault, Vault], tier: MemoryTier, store_clock: StoreClock
) -> None:
    a, b = pair
    shipped = [_shipped(a, tier, 100 + seed) for seed in range(FANIN)]
    _gc_both(a, b)
    (merged,) = _segments(tier)
    assert len(decode_listing(tier.get(merged))) == FANIN
    gone_id, _, gone_packs, gone_ids = shipped[0]
    a.delete_many("ns", [gone_id])
    for _ in range(4):  # condemned, then deleted once every mark acks it past the grace
        _gc_both(a, b)
        store_clock.pass_grace()
    assert _packs(tier) == set().union(*(p for _, _, p, _ in shipped[1:]))
    (rewritten,) = _segments(tier)
    assert rewritten != merged
    listed = {pack for pack, _ in decode_listing(tier.get(rewritten))}
    assert listed == _packs(tier)
    assert not listed & gone_packs
    cold = _cold(tier)
    assert cold.lookup(gone_ids) == {}
    for ckpt, data, _, ids in shipped[1:]:
        assert set(cold.lookup(ids)) == set(ids)
        assert read_file(a, "ns", ckpt, "w") == data


def test_a_process_that_listed_the_sources_still_finds_their_packs_listed(
    pair: tuple[Vault, Vault], tier: MemoryTier
) -> None:
    a, b = pair
    shipped = [_shipped(a, tier, 200 + seed) for seed in range(FANIN)]
    index = b.store.shared
    assert index is not None
    index.refresh()
    assert len(index.segments()) == FANIN  # b holds the one-pack segments
    _gc_both(a, b)  # a merges them and deletes the sources
    for _, _, packs, ids in shipped:
        assert all(index.lists(p) for p in packs)  # so b's own GC would keep them
        assert set(index.lookup(ids)) == set(ids)
    assert len(index.segments()) == 1


def test_no_merge_under_a_grace_too_short_to_outlast_a_put(
    pair: tuple[Vault, Vault], tier: MemoryTier
) -> None:
    a, _ = pair
    for seed in range(FANIN):
        _shipped(a, tier, 300 + seed)
    index = a.store.shared
    assert index is not None
    assert isinstance(index.gate, Condemned)
    report = compact(index.gate, MIN_GRACE - 1, FANIN)
    assert report.merged == 0
    assert report.skipped is not None
    assert "grace" in report.skipped
    assert len(_segments(tier)) == FANIN


def test_a_merged_segment_round_trips_and_refuses_damage() -> None:
    rows = [(bytes([i]) * 32, i * 100, 100, 150, 0) for i in range(3)]
    listing = [("packs/a-s0-1", rows[:2]), ("packs/b-s1-2", rows[2:])]
    raw = encode_merged(listing)
    assert decode_listing(raw) == listing
    assert decode_listing(encode_segment("packs/a-s0-1", rows)) == [("packs/a-s0-1", rows)]
    for bad in (raw[:-1], raw + b"\0", raw[:5]):
        with pytest.raises(TierError):
            decode_listing(bad)
