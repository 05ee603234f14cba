"""Parts across two engines over one shared tier (memory here; SeaweedFS and HTTP in
tests/integration/test_cluster_parts.py): a part shipped by one is adopted by the other's
commit without a byte sent; one not shipped fails the commit and leaves nothing (or, not
waiting for shipping, makes a checkpoint not durable until adopted); tiering and
compaction leave parts where shipping needs them."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.protocol import CommitFile
from checkpoint_vault.tiering import MemoryTier
from checkpoint_vault.tiering.runner import run_tiering
from checkpoint_vault.vault import FakeClock, Vault, VaultConfig
from checkpoint_vault.vault.errors import CheckpointNotFound, MissingChunks, PartNotShipped
from checkpoint_vault.vault.frame import chunk_id
from checkpoint_vault.vault.parts import PartManifest, PartsCommit

from ..vault.helpers import read_file


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Vault, Vault]]:
    tier = MemoryTier("shared")
    vaults = [
        Vault(
            tmp_path / name,
            VaultConfig(gc_grace=0.0, shared_tier="shared", shared_writer=f"{name}-s0"),
            FakeClock(),
            tiers={"shared": tier, "cold": MemoryTier("cold")},  # cold: each node's own
        )
        for name in ("a", "b")
    ]
    yield vaults[0], vaults[1]
    for v in vaults:
        v.close()


def save_part(vault: Vault, ns: str, name: str, data: bytes) -> PartManifest:
    session, _ = vault.parts.open(ns, "t")
    pieces = [data[i : i + 4096] for i in range(0, len(data), 4096)]
    ids = [chunk_id(p).hex() for p in pieces]
    for cid, piece in zip(ids, pieces, strict=True):
        vault.uploads.put_chunk(session.id, cid, piece)
    return vault.parts.commit(session.id, {name: CommitFile(len(data), chunk_id(data).hex(), ids)})


def test_a_shipped_part_is_adopted_by_the_owner_and_an_unshipped_one_fails_cleanly(
    pair: tuple[Vault, Vault],
) -> None:
    host, owner = pair
    data = random.Random(1).randbytes(200_000)
    far = save_part(host, "job/x", "far.bin", data)
    near = save_part(owner, "job/x", "near.bin", b"N" * 10_000)
    assert not far.shipped
    # tiering on the part's node with a policy that demotes everything into its own cold
    # tier leaves parts hot: packed there, the shared tier could never list them
    host.set_policy(None, {"tiering": {"target": "cold", "keep_hot_last": 0}})
    run_tiering(host)
    assert not host.parts.manifest(far.id).shipped

    commit = PartsCommit("job/x", [far, near], "t", [("a", far.id), ("", near.id)])
    with pytest.raises(PartNotShipped):
        owner.parts.commit_parts(commit)
    assert owner.checkpoints("job/x")[0] == []  # nothing visible, and its upload aborted
    assert not owner.uploads.open_sessions()

    shipped = host.parts.ship(far.id)
    assert shipped.shipped
    chunks_before = owner.stats().chunks
    ckpt = owner.parts.commit_parts(commit)
    assert owner.stats().chunks == chunks_before + len({c for c, _ in far.files["far.bin"].chunks})
    assert read_file(owner, "job/x", ckpt.id, "far.bin") == data
    assert read_file(owner, "job/x", ckpt.id, "near.bin") == b"N" * 10_000
    assert owner.get("job/x", "latest").id == ckpt.id


def test_a_commit_before_shipping_is_visible_not_durable_and_safe_until_adopted(
    pair: tuple[Vault, Vault],
) -> None:
    """M2 on two engines: the commit before shipping makes a checkpoint `durable: false`
    that holds no reference to chunks the owner lacks; a fork of it, scrub, tiering, GC
    and `check` are safe with it; once shipped, adoption makes it durable and readable."""
    host, owner = pair
    data = random.Random(2).randbytes(100_000)
    far = save_part(host, "job/y", "far.bin", data)
    near = save_part(owner, "job/y", "near.bin", b"M" * 5_000)
    refs = [("a", far.id), ("", near.id)]
    commit = PartsCommit("job/y", [far, near], "t", refs, wait_durable=False)
    ckpt = owner.parts.commit_parts(commit)
    assert not ckpt.durable
    assert owner.parts.commit_parts(commit).id == ckpt.id  # a retry answers the same
    assert owner.get("job/y", "latest").id == ckpt.id
    with pytest.raises(CheckpointNotFound):
        owner.get("job/y", "latest-valid", durable=True)
    assert read_file(owner, "job/y", ckpt.id, "near.bin") == b"M" * 5_000  # its chunks are here
    with pytest.raises(MissingChunks):  # made of chunks not here: refused, nothing made
        owner.lifecycle.fork("job/y", ckpt.id, "job/fork", by="t")
    owner.set_policy(None, {"tiering": {"target": "cold", "keep_hot_last": 0}})
    run_tiering(owner)
    owner.gc()
    assert owner.verify("job/y").corrupt == []
    assert owner.check().ok
    assert owner.parts.durability.adopt(ckpt.id) is None  # not shipped yet

    host.parts.ship(far.id)
    assert owner.parts.durability.adopt(ckpt.id) == refs  # the parts to release
    assert owner.get("job/y", "latest-valid", durable=True).id == ckpt.id
    assert read_file(owner, "job/y", ckpt.id, "far.bin") == data
    assert owner.parts.durability.waiting() == []
    assert owner.check().ok
