"""Compaction among everything else: random tensor files and random sequences of save,
delete, retention, GC, compaction, demotion and promotion; every checkpoint left reads
back byte-identical and the catalog checks clean."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save as save_safetensors

from checkpoint_vault.protocol import CommitFile, StreamChunker, tensor_regions
from checkpoint_vault.tiering import MemoryTier
from checkpoint_vault.tiering.runner import run_tiering
from checkpoint_vault.vault import FakeClock, Vault, VaultConfig
from checkpoint_vault.vault.chunking import ChunkingProfile
from checkpoint_vault.vault.frame import chunk_id

from ..vault.helpers import read_file

PROFILE = ChunkingProfile("custom", 512, 1024, 8192, tensor_pieces=8192)
OPS = ("save", "save", "save", "delete", "retention", "gc", "compact", "compact", "tier", "promote")
HOUR = 3600.0


def tensor_save(vault: Vault, ns: str, name: str, data: bytes) -> str:
    """Save one file the way the client does: tensors in fixed pieces, FastCDC around."""
    session, _ = vault.open_upload(ns, chunking={**PROFILE.to_wire(), "profile": "custom"})
    regions = tensor_regions(io.BytesIO(data), len(data), PROFILE.tensor_pieces)
    chunks = [bytes(c) for c in StreamChunker(PROFILE, regions=regions).feed(data, True)]
    ids = [chunk_id(c).hex() for c in chunks]
    missing = set(vault.uploads.missing(session.id, ids))
    for cid, chunk in zip(ids, chunks, strict=True):
        if cid in missing:
            vault.uploads.put_chunk(session.id, cid, chunk)
    record, _ = vault.committer.commit(
        session.id, {name: CommitFile(len(data), chunk_id(data).hex(), ids)}
    )
    return record.id


class Model:
    """Tensors that evolve like training: dense small changes, sparse rows, frozen parts."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.t = {
            "dense": self.rng.standard_normal((64, 200)).astype(np.float32),
            "table": self.rng.standard_normal((300, 32)).astype(np.float32),
            "frozen": self.rng.standard_normal(5000).astype(np.float32),
            "half": self.rng.standard_normal(9000).astype(np.float16),
        }

    def step(self) -> None:
        t = self.t
        t["dense"] = (t["dense"] * (1 + 1e-3 * self.rng.standard_normal(t["dense"].shape))).astype(
            np.float32
        )
        rows = self.rng.choice(len(t["table"]), 6, replace=False)
        t["table"][rows] += self.rng.standard_normal((6, 32)).astype(np.float32) * 0.01
        t["half"] = (t["half"] + np.float16(0.001)).astype(np.float16)

    def file(self, torch_format: bool) -> bytes:
        if not torch_format:
            return save_safetensors(self.t)
        buf = io.BytesIO()
        torch.save({k: torch.from_numpy(v.copy()) for k, v in self.t.items()}, buf)
        return buf.getvalue()


@pytest.mark.slow
@settings(max_examples=12, deadline=None)
@given(ops=st.lists(st.sampled_from(OPS), min_size=4, max_size=22), seed=st.integers(0, 2**16))
def test_every_checkpoint_reads_back_after_any_sequence(ops: list[str], seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        clock = FakeClock()
        cold = MemoryTier("cold")
        vault = Vault(Path(tmp) / "v", VaultConfig(gc_grace=60.0), clock, tiers={"cold": cold})
        try:
            run(vault, clock, ops, seed)
        finally:
            vault.close()


def run(vault: Vault, clock: FakeClock, ops: list[str], seed: int) -> None:
    model = Model(seed)
    rng = np.random.default_rng(seed)
    saved: dict[str, bytes] = {}
    for op in ["save", "save", *ops]:
        clock.advance(HOUR)
        if op == "save":
            model.step()
            data = model.file(torch_format=bool(rng.integers(2)))
            saved[tensor_save(vault, "ns", "model.bin", data)] = data
        elif op == "delete" and saved:
            victim = sorted(saved)[int(rng.integers(len(saved)))]
            vault.lifecycle.delete("ns", victim)
            del saved[victim]
        elif op == "retention":
            vault.set_policy("ns", {"retention": {"keep_last": 3}})
            for gone in vault.retention(dry_run=False).deleted:
                saved.pop(gone, None)
        elif op == "gc":
            clock.advance(vault.config.upload_ttl + vault.config.gc_grace + 1)
            vault.gc()
        elif op == "compact":
            vault.compact()
        elif op == "tier":
            vault.set_policy("ns", {"tiering": {"target": "cold", "demote_after": "1h"}})
            run_tiering(vault)
        elif op == "promote":
            with vault.store.catalog_env.read() as txn:
                packed = [c for c, _ in vault.store.chunks.packed_locations(txn)]
            vault.content.promote(packed[: len(packed) // 2])
        for ckpt, data in saved.items():
            assert read_file(vault, "ns", ckpt, "model.bin") == data, (op, ckpt)
    report = vault.check()
    assert report.ok, report


def test_a_mixed_sequence_stores_deltas_that_survive_tiering(tmp_path: Path) -> None:
    clock = FakeClock()
    vault = Vault(
        tmp_path / "v", VaultConfig(gc_grace=60.0), clock, tiers={"cold": MemoryTier("c")}
    )
    try:
        ops = ["save", "compact", "tier", "save", "compact", "promote", "delete", "gc", "compact"]
        run(vault, clock, ops, 3)
        assert vault.stats().codecs["delta"].chunks > 0
    finally:
        vault.close()
