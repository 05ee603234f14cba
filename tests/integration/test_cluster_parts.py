"""A checkpoint from many hosts, committed once (issue 44): two shard processes are two
"hosts" over one SeaweedFS with a shared tier, HAProxy in front. Each host's ranks (or
plain clients) save parts on their own node; one commit through the proxy makes one
checkpoint on the namespace's owner. A node SIGKILLed after its part was committed, or
before, leaves nothing visible; the retry after its restart commits; parts of an abandoned
commit expire and are collected.

Before this change there was no part: every rank of a DCP save sent its bytes into one
upload on the owner (client/dcp.py), and `/v1/parts` did not exist."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.dcp import VaultReader
from checkpoint_vault.client.errors import NotFound, PartGone, PartUnavailable
from checkpoint_vault.client.transport import RetryPolicy
from checkpoint_vault.cluster.shards import shard_of

from ..cluster import Cluster, call, wait_for
from ..seaweed import SeaweedFS
from ..serverproc import free_port
from . import dcp_hosts_worker

# dcp.load in this process warns that torch.distributed is not initialized: it is not.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings(
        "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
    ),
]

ROOT = Path(__file__).resolve().parents[2]
RANK_TIMEOUT = 120  # seconds for a whole 4-process save or load, torch import included
WORLD = 4
EXTRA = "[gc]\ngrace = 0\n"  # collected as soon as unreferenced: the test sees it at once
SIZE = int(os.environ.get("CKPT_PARTS_MIB", "4")) << 20  # each plain part's file


def _owned_by(shard: int, prefix: str) -> str:
    return next(n for n in (f"{prefix}-{i}" for i in range(50)) if shard_of(n, 2) == shard)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, seaweed: SeaweedFS) -> Iterator[Cluster]:
    c = Cluster(
        tmp_path_factory.mktemp("parts"), seaweed, secrets.token_hex(4), shards=2, shared=True,
        extra=EXTRA,
    )  # fmt: skip
    try:
        c.start()
        yield c
    finally:
        c.stop()


def _once(url: str, token: str) -> VaultClient:
    """A client that does not retry: a dead node's 503 is the answer the test expects."""
    return VaultClient(url, token, progress=False, retry=RetryPolicy(attempts=1))


def _held(cluster: Cluster, node: int) -> list[dict[str, Any]]:
    proc = cluster.nodes[node]
    status, body = call(proc.url, cluster.token, "GET", "/v1/parts")
    assert status == 200, body
    return list(body["parts"])


def _chunks(cluster: Cluster, node: int) -> int:
    """Chunks in one node's own catalog (its own stats, not the cluster's sum)."""
    proc = cluster.nodes[node]
    own = {"X-Ckpt-Forwarded": "test"}
    status, body = call(proc.url, cluster.token, "GET", "/v1/stats", headers=own)
    assert status == 200, body
    return int(body["chunks"])


def _restart(cluster: Cluster, node: int) -> None:
    """Start a killed node again and wait until every node counts it live (the owner asks
    only live members for parts)."""
    proc = cluster.nodes[node]
    proc.start()
    wait_for(
        "every node seeing both shards owned",
        lambda: all(all(o["owner"] for o in cluster.state(i)["shard_owners"]) for i in range(2)),
    )


def _ranks(
    cluster: Cluster,
    ns: str,
    every: dict[str, Any] | None = None,
    one: dict[int, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Four ranks: 0-1 near node A (nodes[0]), 2-3 near node B; their JSON lines. `every`:
    more arguments for every rank, `one`: for some."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = []
    for rank in range(WORLD):
        args = {
            "proxy": cluster.proxy.url, "near": cluster.nodes[rank // 2].url,
            "token": cluster.token, "ns": ns, "port": port, "rank": rank, "world": WORLD,
            **(every or {}), **(one or {}).get(rank, {}),
        }  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.integration.dcp_hosts_worker", json.dumps(args)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        )
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=RANK_TIMEOUT)
            assert proc.returncode == 0, err[:2500] + "\n...\n" + err[-1500:]
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outputs


def test_dcp_across_two_hosts_is_one_checkpoint_and_survives_a_node_killed_mid_save(
    cluster: Cluster,
) -> None:
    ns = _owned_by(0, "dcp/hosts")  # owned by node A; node B's ranks' parts travel
    a, b = cluster.nodes
    with VaultClient(a.url, cluster.token, progress=False) as client_a:
        chunks_before = _chunks(cluster, 0)

        # Rank 2 SIGKILLs node B once its part is committed: rank 3's part may be committed
        # too, or cut short. Every rank's dcp.save fails, and nothing is visible.
        failed = _ranks(cluster, ns, {"part_ttl": 3.0}, {2: {"kill_pid": b.pid}})
        assert all(r["checkpoint"] is None and r["error"] for r in failed), failed
        assert b.kill() == -9  # killed by rank 2 (reaped here)
        with pytest.raises(NotFound):
            client_a.get(ns, "latest")

        # B restarts; the abandoned parts (on A: ranks 0-1 and the metadata; on B: rank 2's,
        # maybe 3's) expire after their 3 s and GC forgets their chunks on A.
        _restart(cluster, 1)
        wait_for("abandoned parts expired", lambda: not _held(cluster, 0) + _held(cluster, 1))
        client_a.gc()
        assert _chunks(cluster, 0) == chunks_before

        # The retry commits: one checkpoint, one id, on the owner.
        saved = _ranks(cluster, ns)
        ckpt_id = saved[0]["checkpoint"]
        assert ckpt_id, saved
        assert [r["error"] for r in saved] == [None] * WORLD, saved
        assert [r["checkpoint"] for r in saved[1:]] == [None] * 3  # only the coordinator
        listed = client_a.list(ns)
        assert [c.id for c in listed] == [ckpt_id]
        assert sorted(listed[0].files) == [".metadata", *(f"__{r}_0.distcp" for r in range(4))]
        assert listed[0].metadata == {"step": 5}

    # dcp.load through either host's node (B forwards to the owner) restores identical
    # tensors: the four row shards resharded into whole ones, in this process.
    full = dcp_hosts_worker.expected()
    for proc in (a, b):
        whole = {
            "model": {k: torch.zeros_like(v) for k, v in full.items()},
            "extra": {"epoch": 0},
        }
        with VaultClient(proc.url, cluster.token, progress=False) as client:
            dcp.load(whole, storage_reader=VaultReader(client, ns, "latest-valid"))
        assert all(torch.equal(whole["model"][k], full[k]) for k in full)
        assert whole["extra"] == {"epoch": 5}
    wait_for("adopted parts released", lambda: not _held(cluster, 0) + _held(cluster, 1))


def test_plain_files_in_parts_on_two_nodes_commit_once_and_fail_cleanly(
    cluster: Cluster, tmp_path: Path
) -> None:
    ns = _owned_by(1, "files/hosts")  # owned by node B this time; A's part travels
    a, b = cluster.nodes
    rng = secrets.token_bytes
    (tmp_path / "x.bin").write_bytes(rng(SIZE))
    (tmp_path / "y.bin").write_bytes(rng(SIZE))
    with (
        VaultClient(a.url, cluster.token, progress=False) as near_a,
        VaultClient(b.url, cluster.token, progress=False) as near_b,
        _once(cluster.proxy.url, cluster.token) as proxy,
    ):
        on_a = near_a.save_part(ns, {"x.bin": tmp_path / "x.bin"})
        # B's part in steps, as several processes of one host would write it
        upload = near_b.begin_part(ns)
        files = {
            "y.bin": near_b.send_file(upload, "y.bin", tmp_path / "y.bin"),
            "z.json": near_b.send_file(upload, "z.json", b'{"step": 1}'),
        }
        on_b = near_b.commit_part(upload, files)
        assert (on_a.node, on_b.node) == (a.url, b.url)
        assert on_b.files == ("y.bin", "z.json")

        # A dies after its part was committed, before the commit: 503, nothing visible.
        a.kill()
        with pytest.raises(PartUnavailable):
            proxy.commit_parts(ns, [on_a, on_b], metadata={"step": 1})
        with pytest.raises(NotFound):
            proxy.get(ns, "latest")

        # A restarts with its part still held: the same commit now succeeds, once.
        _restart(cluster, 0)
        with VaultClient(cluster.proxy.url, cluster.token, progress=False) as retrying:
            ckpt = retrying.commit_parts(ns, [on_a, on_b], metadata={"step": 1})
            assert sorted(ckpt.files) == ["x.bin", "y.bin", "z.json"]
            assert [c.id for c in retrying.list(ns)] == [ckpt.id]
            assert retrying.open(ns, ckpt.id, "x.bin").read() == (tmp_path / "x.bin").read_bytes()
            assert retrying.open(ns, ckpt.id, "z.json").read() == b'{"step": 1}'
            # the parts were released: the same commit again (its answer lost, say) answers
            # the same checkpoint; naming a released part otherwise is refused
            wait_for("parts released", lambda: not _held(cluster, 0) + _held(cluster, 1))
            assert retrying.commit_parts(ns, [on_b, on_a], metadata={"step": 1}).id == ckpt.id
            with pytest.raises(PartGone):
                retrying.commit_parts(ns, [on_a])
            assert [c.id for c in retrying.list(ns)] == [ckpt.id]

        # B's node dies before its part is committed: the writer has no part to name;
        # A's part, abandoned, expires and is collected.
    with VaultClient(a.url, cluster.token, progress=False) as near_a:
        before = _chunks(cluster, 0)
        lost = near_a.save_part(ns, {"x2.bin": rng(SIZE)}, ttl=3.0)
        assert _chunks(cluster, 0) > before
        up = VaultClient(b.url, cluster.token, progress=False)
        with up:
            upload = up.begin_part(ns)
            up.send_file(upload, "y2.bin", rng(SIZE))
            b.kill()
        wait_for("the abandoned part expired", lambda: not _held(cluster, 0))
        near_a.gc()
        assert _chunks(cluster, 0) == before
        status, body = call(a.url, cluster.token, "GET", f"/v1/parts/{lost.id}")
        assert (status, body["error"]["code"]) == (409, "part_gone")
    _restart(cluster, 1)
