"""A small file saved in one request is one chunk, patched against the same file in the
parent (vault/smallfile.py): every version reads back, chains stay within MAX_CHAIN, and
GC, retention, compaction, verify, tiering and replication handle patches and their bases."""

from __future__ import annotations

import json
import random
from pathlib import Path

import blake3

from checkpoint_vault.tiering import MemoryTier
from checkpoint_vault.tiering.backends.local import LocalTier
from checkpoint_vault.tiering.runner import run_tiering
from checkpoint_vault.vault import FakeClock, Vault, VaultConfig
from checkpoint_vault.vault.content.reader import MAX_CHAIN
from checkpoint_vault.vault.frame import CODEC_PATCH, Encoder, frame_codec
from checkpoint_vault.vault.replication import ReplicationConfig, restore_replica

from .helpers import read_file
from .test_scrub import flip_on_disk


def _states(n: int, seed: int = 1) -> list[bytes]:
    """An agent's state after each of `n` steps: a message list (~10 kB at first) that
    grows by one message per step."""
    rng = random.Random(seed)
    words = ("plan", "tool", "call", "result", "diff", "file", "ok", "error", "retry")
    msgs: list[dict[str, str]] = [{"role": "system", "content": "you are a careful agent"}]
    out = []
    for step in range(n + 10):
        text = " ".join(rng.choice(words) for _ in range(rng.randrange(60, 200)))
        msgs.append({"role": rng.choice(("user", "assistant", "tool")), "content": text})
        out.append(json.dumps({"step": step, "messages": msgs}).encode())
    return out[10:]


def _save_all(vault: Vault, ns: str, states: list[bytes]) -> list[str]:
    ids: list[str] = []
    for state in states:
        parent = ids[-1] if ids else None
        rec, _ = vault.save(ns, {"state.json": state}, parent=parent, chunking="small")
        ids.append(rec.id)
    return ids


def _chunk(vault: Vault, ns: str, ref: str) -> bytes:
    _, files = vault.manifest(ns, ref)
    (cid, _), *more = files["state.json"].chunks
    assert not more
    return cid


def _patches(vault: Vault) -> int:
    """How many chunks are stored as deltas (patches here)."""
    with vault.store.catalog_env.read() as txn:
        return sum(m.delta for _, m in vault.store.chunks.all(txn))


def test_each_version_is_one_chunk_patched_against_its_parent(vault: Vault) -> None:
    states = _states(3 * MAX_CHAIN)
    ids = _save_all(vault, "a/t", states)
    for cid, state in zip(ids, states, strict=True):
        assert read_file(vault, "a/t", cid, "state.json") == state
        assert _chunk(vault, "a/t", cid) == blake3.blake3(state).digest()  # the file's hash
    chunks = vault.store.chunks
    with vault.store.catalog_env.read() as txn:
        depths = [len(chunks.chain(txn, _chunk(vault, "a/t", c), MAX_CHAIN + 1)) - 1 for c in ids]
        patched = sum(d > 0 for d in depths)
    assert max(depths) == MAX_CHAIN  # chains are as long as a read may decode, no longer
    assert patched >= len(ids) - len(ids) // MAX_CHAIN - 1
    whole = sum(len(Encoder().encode(s)) for s in states)
    assert vault.stats().stored_bytes < whole / 4
    assert vault.check().ok


def test_deleted_parents_keep_their_chunks_for_the_patches_that_need_them(
    vault: Vault, clock: FakeClock
) -> None:
    states = _states(MAX_CHAIN)
    ids = _save_all(vault, "a/t", states)
    vault.set_policy("a/t", {"retention": {"keep_last": 1}})
    plan = vault.retention(dry_run=True, namespace="a/t")
    assert plan.namespaces["a/t"].reclaimable_bytes == 0  # every chunk is a base of the last
    vault.retention(dry_run=False, namespace="a/t")
    clock.advance(3600 * 24)
    assert vault.gc().chunks_deleted == 0
    assert read_file(vault, "a/t", ids[-1], "state.json") == states[-1]
    assert vault.check().ok
    vault.lifecycle.delete("a/t", ids[-1])
    clock.advance(3600 * 24)
    assert vault.gc().chunks_deleted == len(ids)  # the whole chain, in one run
    assert vault.stats().chunks == 0
    assert vault.check().ok


def test_compaction_leaves_every_version_readable(vault: Vault, clock: FakeClock) -> None:
    states = _states(2 * MAX_CHAIN + 3)
    ids = _save_all(vault, "a/t", states)
    assert _patches(vault) >= len(ids) - 3
    vault.lifecycle.delete("a/t", ids[3])  # a base kept only for its patches
    vault.compact()
    clock.advance(3600 * 24)
    vault.gc()
    for cid, state in zip(ids, states, strict=True):
        if cid != ids[3]:
            assert read_file(vault, "a/t", cid, "state.json") == state
    assert vault.check().ok


def test_a_damaged_base_invalidates_its_patches_and_heals(tmp_path: Path) -> None:
    clock = FakeClock()
    vault = Vault(tmp_path / "v", VaultConfig(), clock)
    states = _states(4)
    ids = _save_all(vault, "a/t", states)
    first = vault.store.chunks
    with vault.store.catalog_env.read() as txn:
        meta = first.meta(txn, _chunk(vault, "a/t", ids[0]))
    assert meta is not None
    assert not meta.delta
    vault.close()
    # The whole frame is zstd: flip bytes of its compressed form as stored (inline).
    frame = Encoder().encode(states[0])
    flip_on_disk(tmp_path / "v" / "catalog" / "data.mdb", frame[100:164])

    vault = Vault(tmp_path / "v", VaultConfig(), clock)
    report = vault.verify()
    assert _chunk(vault, "a/t", ids[0]).hex() in report.corrupt
    assert sorted(report.checkpoints_invalidated) == sorted(ids)  # every patch needs it
    vault.save("b/t", {"state.json": states[0]}, chunking="small")  # the same bytes heal it
    healed = vault.verify()
    assert healed.corrupt == []
    assert sorted(healed.checkpoints_healed) == sorted(ids)
    for cid, state in zip(ids, states, strict=True):
        assert read_file(vault, "a/t", cid, "state.json") == state
    assert vault.check().ok
    vault.close()


def test_a_patch_whose_base_is_damaged_before_its_commit_is_stored_whole(vault: Vault) -> None:
    states = _states(2)
    (parent,) = _save_all(vault, "a/t", states[:1])
    prepared = vault.prepare_save("a/t", {"state.json": states[1]}, chunking="small", parent=parent)
    (frame,) = prepared.frames.values()
    assert frame_codec(frame) == CODEC_PATCH
    vault.reader.flag_damaged({_chunk(vault, "a/t", parent)})  # found damaged meanwhile
    rec, created = vault.commit_prepared(prepared).result()
    assert created
    with vault.store.catalog_env.read() as txn:
        meta = vault.store.chunks.meta(txn, _chunk(vault, "a/t", rec.id))
    assert meta is not None
    assert not meta.delta
    assert read_file(vault, "a/t", rec.id, "state.json") == states[1]


def test_patches_move_to_a_tier_and_read_back(tmp_path: Path) -> None:
    clock = FakeClock()
    cold = MemoryTier("cold")
    vault = Vault(tmp_path / "v", VaultConfig(gc_grace=0.0), clock, tiers={"cold": cold})
    try:
        states = _states(MAX_CHAIN + 3)
        ids = _save_all(vault, "a/t", states)
        assert _patches(vault) >= len(ids) - 2
        clock.advance(8 * 86400)
        vault.set_policy(
            "a/t", {"tiering": {"target": "cold", "demote_after": "7d", "keep_hot_last": 2}}
        )
        moved = run_tiering(vault).moved
        assert moved is not None
        assert moved["cold"].chunks > 0
        assert vault.get("a/t", ids[0]).tier == "cold"
        for cid, state in zip(ids, states, strict=True):
            assert read_file(vault, "a/t", cid, "state.json") == state
        assert vault.check().ok
    finally:
        vault.close()


def test_a_replica_restores_patched_versions(tmp_path: Path) -> None:
    tier = LocalTier(str(tmp_path / "tier"), "cold")
    vault = Vault(
        tmp_path / "primary", tiers={"cold": tier}, replication=ReplicationConfig(tier="cold")
    )
    states = _states(MAX_CHAIN + 2)
    try:
        ids = _save_all(vault, "a/t", states)
        assert vault.roles.replication is not None
        assert vault.roles.replication.wait_restorable(20.0)
    finally:
        vault.close()
    restore_replica(tier, tmp_path / "restored")
    restored = Vault(tmp_path / "restored")
    try:
        assert _patches(restored) >= len(ids) - 2
        for cid, state in zip(ids, states, strict=True):
            assert read_file(restored, "a/t", cid, "state.json") == state
        assert restored.check().ok
    finally:
        restored.close()
