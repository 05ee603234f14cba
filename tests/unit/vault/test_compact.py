"""Compaction: older checkpoints re-encoded as deltas against their successors, losslessly,
with every other operation (delete, GC, verify, heal, check) still right around them."""

from __future__ import annotations

import numpy as np
import pytest

from checkpoint_vault.vault import Vault
from checkpoint_vault.vault.clock import FakeClock
from checkpoint_vault.vault.content import HotFrame
from checkpoint_vault.vault.content.chunks import seq_key
from checkpoint_vault.vault.content.reader import MAX_CHAIN
from checkpoint_vault.vault.frame import chunk_id
from checkpoint_vault.vault.writer import WriteTxn

from .helpers import client_save, read_file

PIECE = 64 << 10


def fp32_series(count: int, n: int = 1 << 18, seed: int = 0) -> list[bytes]:
    """Weights that all change a little between checkpoints, like a full fine-tune."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(n).astype(np.float32)
    out = []
    for _ in range(count):
        out.append(w.tobytes())
        w = (w - 1e-3 * rng.standard_normal(n).astype(np.float32) * np.abs(w)).astype(np.float32)
    return out


def sparse_series(count: int, n: int = 1 << 18, seed: int = 1) -> list[bytes]:
    """Rows of a table updated here and there, like embeddings: adjacent deltas win."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal(n) * 0.05).astype(np.float32)
    out = []
    for _ in range(count):
        out.append(w.tobytes())
        w = w.copy()
        rows = rng.choice(n // 64, n // 64 // 50, replace=False)
        for r in rows:
            w[r * 64 : r * 64 + 64] += rng.standard_normal(64).astype(np.float32) * 1e-3
    return out


def save_series(vault: Vault, ns: str, files: list[bytes]) -> list[str]:
    return [client_save(vault, ns, {"w.bin": f}, chunk_size=PIECE).id for f in files]


def chunk_set(vault: Vault, ckpt: str) -> set[bytes]:
    _, m = vault.manifest("ns", ckpt)
    return {c for c, _ in m["w.bin"].chunks}


def depth(vault: Vault, cid: bytes) -> int:
    with vault.store.catalog_env.read() as txn:
        return len(vault.store.chunks.chain(txn, cid, 100)) - 1


def test_compaction_shrinks_older_checkpoints_and_every_one_reads_back(vault: Vault) -> None:
    files = fp32_series(5)
    ids = save_series(vault, "ns", files)
    before = vault.stats().stored_bytes
    report = vault.compact()
    after = vault.stats().stored_bytes
    assert report.checkpoints == 4
    assert report.deltas > 0
    assert after < before * 0.8
    assert before - after == report.saved_bytes
    for ckpt, data in zip(ids, files, strict=True):
        assert read_file(vault, "ns", ckpt, "w.bin") == data
    # The newest is stored as it came; a second run has nothing left to do.
    _, newest = vault.manifest("ns", ids[-1])
    with vault.store.catalog_env.read() as txn:
        metas = [vault.store.chunks.meta(txn, c) for c, _ in newest["w.bin"].chunks]
    assert all(m is not None and m.codec == "raw" for m in metas)
    assert vault.compact().chunks_recoded == 0
    assert vault.check().ok


@pytest.mark.parametrize("series", ["dense", "sparse"])
def test_chains_stay_within_the_bound(vault: Vault, series: str) -> None:
    """Compacting after every save (the schedule) deepens every older chain by one; the
    chunks that would pass the bound are re-rooted onto the newest, never kept whole."""
    count = MAX_CHAIN + 4
    files = fp32_series(count, n=1 << 15) if series == "dense" else sparse_series(count)
    ids = []
    for f in files:
        ids.append(save_series(vault, "ns", [f])[0])
        vault.compact()
    for ckpt, data in zip(ids, files, strict=True):
        _, m = vault.manifest("ns", ckpt)
        assert max(depth(vault, c) for c, _ in m["w.bin"].chunks) <= MAX_CHAIN
        assert read_file(vault, "ns", ckpt, "w.bin") == data
    codecs = vault.stats().codecs
    assert codecs["delta"].chunks > 0
    assert codecs["grouped"].chunks == 0  # no keyframe was needed
    assert vault.check().ok


def test_deleting_any_checkpoint_keeps_the_others_readable_through_gc(
    vault: Vault, clock: FakeClock
) -> None:
    files = sparse_series(4)
    ids = save_series(vault, "ns", files)
    vault.compact()
    vault.lifecycle.delete("ns", ids[2])  # the base of ids[1]'s deltas
    clock.advance(vault.config.upload_ttl + vault.config.gc_grace + 1)
    vault.gc()
    with vault.store.catalog_env.read() as txn:
        assert any(m.refs == 0 for _, m in vault.store.chunks.all(txn))  # kept as bases
    for i in (0, 1, 3):
        assert read_file(vault, "ns", ids[i], "w.bin") == files[i]
    # The next run re-encodes what leaned on the deleted checkpoint; its bases then go.
    vault.compact()
    vault.gc()
    with vault.store.catalog_env.read() as txn:
        kept_for_deltas = [c for c, m in vault.store.chunks.all(txn) if m.refs == 0]
    assert kept_for_deltas == []
    for i in (0, 1, 3):
        assert read_file(vault, "ns", ids[i], "w.bin") == files[i]
    assert vault.check().ok


def test_a_damaged_base_flags_its_dependents_and_heals_by_upload(vault: Vault) -> None:
    files = fp32_series(3)
    ids = save_series(vault, "ns", files)
    vault.compact()
    _, m = vault.manifest("ns", ids[0])
    dependent = m["w.bin"].chunks[0][0]
    with vault.store.catalog_env.read() as txn:
        base = vault.store.chunks.base_of(txn, dependent)
    assert base is not None
    vault.store.writer.run(lambda w: vault.store.chunks.mark_damaged(w.catalog, base))
    with vault.store.catalog_env.read() as txn:
        flagged = vault.store.chunks.meta(txn, dependent)
    assert flagged is not None
    assert flagged.damaged
    # Saving the base's bytes again heals it; verify then finds the dependent sound again.
    holder = next(i for i, c in enumerate(ids) if base in chunk_set(vault, c))
    client_save(vault, "ns", {"w.bin": files[holder]}, chunk_size=PIECE)
    report = vault.verify()
    assert report.corrupt == []
    assert read_file(vault, "ns", ids[0], "w.bin") == files[0]
    with vault.store.catalog_env.read() as txn:
        healed = vault.store.chunks.meta(txn, dependent)
    assert healed is not None
    assert not healed.damaged


def test_verify_invalidates_what_a_corrupt_base_breaks(vault: Vault) -> None:
    files = fp32_series(3)
    ids = save_series(vault, "ns", files)
    vault.compact()
    with vault.store.catalog_env.read() as txn:
        base = next(
            c for c, _ in vault.store.chunks.all(txn) if vault.store.chunks.dependents(txn, c)
        )
        meta = vault.store.chunks.meta(txn, base)
        needing = {base, *vault.store.chunks.dependents(txn, base)}
    assert meta is not None
    assert isinstance(meta.where, HotFrame)
    key, db = seq_key(meta.where.seq), vault.store.frames_env.db["frames"]

    def corrupt(w: WriteTxn) -> None:
        stored = w.frames.get(key, db=db)
        assert stored is not None
        frame = bytearray(stored)
        frame[-1] ^= 0xFF
        w.frames.put(key, bytes(frame), db=db)

    vault.store.writer.run(corrupt)
    report = vault.verify()
    assert base.hex() in report.corrupt
    broken = {c for c in ids if chunk_set(vault, c) & needing}
    assert len(broken) >= 2
    assert set(report.checkpoints_invalidated) == broken


@pytest.mark.parametrize("count", [2, 6])
def test_compaction_is_lossless_for_random_bytes_too(vault: Vault, count: int) -> None:
    rng = np.random.default_rng(count)
    files = [rng.integers(0, 256, 300_000, dtype=np.uint8).tobytes() for _ in range(count)]
    ids = save_series(vault, "ns", files)
    vault.compact()
    for ckpt, data in zip(ids, files, strict=True):
        assert read_file(vault, "ns", ckpt, "w.bin") == data
        assert chunk_id(data) == chunk_id(read_file(vault, "ns", ckpt, "w.bin"))


def test_check_knows_bases(vault: Vault, clock: FakeClock) -> None:
    """Unreferenced bases a delta needs are not orphans; a delta whose base vanished is
    reported, and repair flags it damaged so the next save of its bytes heals it."""
    files = sparse_series(4)
    ids = save_series(vault, "ns", files)
    vault.compact()
    vault.lifecycle.delete("ns", ids[2])
    clock.advance(vault.config.upload_ttl + vault.config.gc_grace + 1)
    vault.gc()
    report = vault.check()
    assert report.ok
    assert report.bases_kept > 0
    assert report.orphans == []
    assert vault.check(repair=True).repaired == 0  # repair keeps the bases too
    for i in (0, 1, 3):
        assert read_file(vault, "ns", ids[i], "w.bin") == files[i]

    with vault.store.catalog_env.read() as txn:
        dependent, base = next(iter(vault.store.chunks.delta_links(txn)))
    vault.store.writer.run(
        lambda w: w.catalog.delete(base, db=vault.store.catalog_env.db["chunkmeta"])
    )
    broken = vault.check()
    assert dependent.hex() in broken.missing
    assert not broken.ok
    vault.check(repair=True)
    with vault.store.catalog_env.read() as txn:
        meta = vault.store.chunks.meta(txn, dependent)
    assert meta is not None
    assert meta.damaged


def test_one_gc_collects_whole_chains_once_only_the_newest_is_left(
    vault: Vault, clock: FakeClock
) -> None:
    """Deleting every checkpoint but the newest of a compacted series leaves chains of
    deltas nothing references; one GC takes them all, not one link per run (issue 32)."""
    files = sparse_series(MAX_CHAIN)
    ids = save_series(vault, "ns", files)
    vault.compact()
    assert max(depth(vault, c) for c in chunk_set(vault, ids[0])) >= MAX_CHAIN - 2
    newest = vault.stats().stored_bytes
    oldest = chunk_set(vault, ids[0])
    for ckpt in ids[:-1]:
        vault.lifecycle.delete("ns", ckpt)
    clock.advance(vault.config.upload_ttl + vault.config.gc_grace + 1)
    report = vault.gc()
    with vault.store.catalog_env.read() as txn:
        left = {c for c, _ in vault.store.chunks.all(txn)}
    assert left == chunk_set(vault, ids[-1])
    assert report.chunks_deleted >= len(oldest - left)
    assert vault.stats().stored_bytes < newest
    assert read_file(vault, "ns", ids[-1], "w.bin") == files[-1]
    assert vault.check().ok
