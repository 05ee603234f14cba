"""Two vaults over one shared tier (memory here; SeaweedFS in
tests/integration/test_cluster_shared.py): what one ships the other neither asks for nor
packs again, and neither's GC deletes a pack the shared index lists."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.maintenance.tasks import gc
from checkpoint_vault.tiering import MemoryTier
from checkpoint_vault.vault import Vault
from checkpoint_vault.vault.content.packs import PackBuilder, pack_key, upload
from checkpoint_vault.vault.content.shared import decode_segment, encode_segment
from checkpoint_vault.vault.errors import Conflict
from checkpoint_vault.vault.frame import chunk_id

from ..vault.helpers import client_save, read_file
from .shared_pair import vault_pair


@pytest.fixture
def tier() -> MemoryTier:
    return MemoryTier("shared")


@pytest.fixture
def pair(tmp_path: Path, tier: MemoryTier) -> Iterator[tuple[Vault, Vault]]:
    with vault_pair(tmp_path, tier) as vaults:
        yield vaults


def _ids(vault: Vault, ns: str, ref: str) -> list[bytes]:
    _, files = vault.manifest(ns, ref)
    return [c for f in files.values() for c, _ in f.chunks]


def _stored(tier: MemoryTier) -> int:
    """Packs and index segments (not the GC's marks, sharedgc.py)."""
    return sum(tier.head(k) or 0 for k in tier.list("") if not k.startswith("gc/"))


def test_what_one_node_shipped_the_other_neither_receives_nor_packs(
    pair: tuple[Vault, Vault], tier: MemoryTier
) -> None:
    a, b = pair
    data = random.Random(1).randbytes(300_000)
    first = client_save(a, "ns-a", {"w": data})
    a.content.demote("shared", _ids(a, "ns-a", first.id))
    one_copy = _stored(tier)
    assert one_copy >= len(data)

    session, _ = b.open_upload("ns-b")
    ids = [chunk_id(data[i : i + 1000]).hex() for i in range(0, len(data), 1000)]
    assert b.uploads.missing(session.id, ids) == []  # all found through the index
    second = client_save(b, "ns-b", {"w": data})
    assert read_file(b, "ns-b", second.id, "w") == data

    # hot chunks that reached b before a shipped them: pointed at a's copy, not packed
    late = random.Random(2).randbytes(100_000)
    third = client_save(b, "ns-b", {"late": late})
    fourth = client_save(a, "ns-a", {"late": late})
    a.content.demote("shared", _ids(a, "ns-a", fourth.id))
    size = _stored(tier)
    report = b.content.demote("shared", _ids(b, "ns-b", third.id))
    assert report.deduplicated == report.chunks_moved > 0
    assert report.packs == 0
    assert _stored(tier) == size
    assert read_file(b, "ns-b", third.id, "late") == late
    assert b.check().ok


def test_gc_never_deletes_a_listed_pack_nor_another_writers(
    pair: tuple[Vault, Vault], tier: MemoryTier
) -> None:
    a, b = pair
    data = random.Random(3).randbytes(200_000)
    first = client_save(a, "ns-a", {"w": data})
    a.content.demote("shared", _ids(a, "ns-a", first.id))
    second = client_save(b, "ns-b", {"w": data})
    # b's pack between its upload and its publish (a SIGKILL there): unlisted, b's own
    orphan = PackBuilder(pack_id="b-s1-" + "0" * 32)
    orphan.add(b"\x01" * 32, b"frame")
    upload(tier, orphan)
    before = _stored(tier)

    a.delete_many("ns-a")
    gc(a)  # a forgets its chunks; the listed pack stays, b's orphan is not a's to delete
    assert _stored(tier) == before
    assert read_file(b, "ns-b", second.id, "w") == data

    gc(b)  # b deletes its own unlisted orphan, nothing listed
    assert tier.head(pack_key(orphan.pack_id)) is None
    assert _stored(tier) == before - orphan.size - tier_index_size(orphan)
    assert read_file(b, "ns-b", second.id, "w") == data


def tier_index_size(pack: PackBuilder) -> int:
    return 8 + 44 * len(pack.entries)  # packs.encode_index: header, then one row a frame


def test_a_segment_round_trips_and_refuses_damage() -> None:
    rows = [(bytes([i]) * 32, i * 10, 10, 9, 0) for i in range(3)]
    raw = encode_segment("packs/n0-s0-ab", rows)
    assert decode_segment(raw) == ("packs/n0-s0-ab", rows)
    with pytest.raises(Exception, match="damaged"):
        decode_segment(raw[:-1])


def test_a_catalog_backup_never_goes_to_the_shared_tier_by_default(
    pair: tuple[Vault, Vault], tier: MemoryTier
) -> None:
    a, _ = pair
    with pytest.raises(Conflict):  # every node's catalog/latest would be one object
        a.catalog_backup()
    assert a.catalog_backup("shared").tier == "shared"  # asked for by name: as asked
