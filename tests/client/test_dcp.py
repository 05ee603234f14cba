"""client.dcp against a real server: dcp.save and dcp.load in this process, and across two
real processes on the gloo backend (loopback, bounded timeouts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.planner import LoadPlan

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.dcp import METADATA_FILE, CheckpointMoved, VaultReader, VaultWriter

from ..serverproc import ServerProcess, free_port
from . import dcp_worker

# dcp.save/load warn that torch.distributed is not initialized, which is what the
# single-process tests mean; the two-process test runs its ranks in child processes.
pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
)

ROOT = Path(__file__).resolve().parents[2]
RANK_TIMEOUT = 120  # seconds for a whole 2-process save or load, torch import included


def train_state(seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict(), "extra": {"step": seed}}


def assert_same(got: Any, want: Any) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor)
        assert torch.equal(got, want)
    elif isinstance(want, dict):
        assert set(got) == set(want)
        for k in want:
            assert_same(got[k], want[k])
    elif isinstance(want, list):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w)
    else:
        assert got == want


def test_single_process_save_is_one_checkpoint_and_loads_back(vault: VaultClient) -> None:
    saved = train_state(1)
    writer = VaultWriter(vault, "dcp/one", metadata={"step": 1}, tags=["dcp"])
    dcp.save(saved, storage_writer=writer)
    assert writer.checkpoint is not None
    ckpt = vault.get("dcp/one", "latest")
    assert ckpt.id == writer.checkpoint.id
    assert sorted(ckpt.files) == [METADATA_FILE, "__0_0.distcp"]
    assert ckpt.metadata == {"step": 1}
    assert ckpt.tags == ["dcp"]

    loaded = train_state(2)  # same shapes, other values
    reader = VaultReader(vault, "dcp/one")
    dcp.load(loaded, storage_reader=reader)
    assert reader.checkpoint is not None
    assert reader.checkpoint.id == ckpt.id
    assert_same(loaded, saved)


def test_rank_file_is_safetensors_and_unchanged_tensors_are_not_sent_again(
    vault: VaultClient,
) -> None:
    frozen = torch.randn(1024, 1024)  # 4 MiB that never changes
    state = {"frozen": frozen, "head": torch.randn(64, 64)}
    dcp.save(state, storage_writer=VaultWriter(vault, "dcp/dedup"))
    state["head"] += 1
    sent = vault.transfer.bytes_sent
    dcp.save(state, storage_writer=VaultWriter(vault, "dcp/dedup"))
    assert vault.transfer.bytes_sent - sent < 200_000  # the head, ids and metadata: not 4 MiB

    from safetensors.torch import load

    with vault.open("dcp/dedup", "latest", "__0_0.distcp") as f:
        as_safetensors = load(f.read())
    assert torch.equal(as_safetensors["frozen"], frozen)
    assert torch.equal(as_safetensors["head"], state["head"])


def test_load_by_id_reads_that_checkpoint_not_the_latest(vault: VaultClient) -> None:
    first = {"w": torch.ones(3)}
    writer = VaultWriter(vault, "dcp/ids")
    dcp.save(first, storage_writer=writer)
    assert writer.checkpoint is not None
    dcp.save({"w": torch.full((3,), 2.0)}, storage_writer=VaultWriter(vault, "dcp/ids"))
    loaded = {"w": torch.zeros(3)}
    dcp.load(
        loaded, storage_reader=VaultReader(vault, "dcp/ids"), checkpoint_id=writer.checkpoint.id
    )
    assert torch.equal(loaded["w"], first["w"])


def test_ranks_that_saw_different_checkpoints_are_refused(vault: VaultClient) -> None:
    reader = VaultReader(vault, "dcp/any")
    with pytest.raises(CheckpointMoved):
        reader.prepare_global_plan([LoadPlan([], storage_data="A"), LoadPlan([], storage_data="B")])


def test_writer_refuses_saves_without_collectives(vault: VaultClient) -> None:
    with pytest.raises(ValueError, match="collectives"):
        dcp.save(
            {"w": torch.ones(2)}, storage_writer=VaultWriter(vault, "dcp/nc"), use_collectives=False
        )
    assert "dcp/nc" not in {n.name for n in vault.namespaces()}


def run_ranks(
    server: ServerProcess, mode: str, namespace: str, *extra: str
) -> list[dict[str, Any]]:
    """Both ranks as real processes; their JSON lines, rank order. Bounded by RANK_TIMEOUT."""
    port = str(free_port())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.client.dcp_worker",
                mode,
                server.url,
                server.token,
                namespace,
                port,
                str(rank),
                *extra,
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(dcp_worker.WORLD)
    ]
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=RANK_TIMEOUT)
            assert proc.returncode == 0, err[-3000:]
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outputs


@pytest.mark.slow
def test_two_gloo_ranks_commit_one_checkpoint_that_loads_anywhere(
    vault: VaultClient, server: ServerProcess
) -> None:
    saved = run_ranks(server, "save", "dcp/two")
    ckpt_id = saved[0]["checkpoint"]
    assert ckpt_id
    assert saved[1]["checkpoint"] is None  # only the coordinator commits
    listed = vault.list("dcp/two")
    assert [c.id for c in listed] == [ckpt_id]  # one upload, one commit
    ckpt = listed[0]
    assert sorted(ckpt.files) == [METADATA_FILE, "__0_0.distcp", "__1_0.distcp"]
    assert ckpt.metadata == {"step": 3}
    # Each rank wrote its half of the row-sharded weight (plus the replicated bias once).
    half = 128 * 96 * 4
    assert all(ckpt.files[f"__{r}_0.distcp"].size >= half for r in range(2))

    # Resharded: two shards into one whole tensor, in this single process.
    full = dcp_worker.expected()
    whole = {
        "model": {k: torch.zeros_like(v) for k, v in full.items()},
        "extra": {"epoch": 0},
    }
    dcp.load(whole, storage_reader=VaultReader(vault, "dcp/two", ckpt_id))
    assert_same(whole, {"model": full, "extra": {"epoch": 3}})

    # And back into two ranks with the original sharding.
    loaded = run_ranks(server, "load", "dcp/two", ckpt_id)
    assert [r["ok"] for r in loaded] == [True, True]
