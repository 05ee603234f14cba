"""Three shard processes behind HAProxy over one SeaweedFS (issue 43, part 1).

300 saves into 30 namespaces through the proxy's URL land on their shards' owners: each
node lists only its own shard's namespaces, and the proxy computed every shard itself (no
node forwarded anything). Every save reads back through the proxy and through every node
(a node forwards what is another shard's: a hop, never a wrong answer). The client's
coalesced `POST /v1/saves`, chunked uploads (`/v1/uploads/{id}`, whose id names its
shard), the CLI and LangGraph's VaultSaver work against the proxy's URL unchanged.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from checkpoint_vault.client import AsyncVaultClient, VaultClient
from checkpoint_vault.cluster import shard_of

from ..cluster import Cluster, call, wait_for
from ..seaweed import SeaweedFS

pytestmark = pytest.mark.slow  # every test here takes over a second (the quick loop skips them)


def _forwarded(cluster: Cluster) -> list[int]:
    return [int(cluster.state(i)["forwarded"]) for i in range(cluster.shards)]


def test_saves_through_the_proxy_land_on_their_shards(cluster: Cluster) -> None:
    namespaces = [f"team-{i}/run" for i in range(30)]
    assert len({shard_of(ns, 3) for ns in namespaces}) == 3
    saved: dict[str, list[tuple[str, bytes]]] = {ns: [] for ns in namespaces}
    with VaultClient(cluster.proxy.url, cluster.token, progress=False) as client:
        for i in range(300):
            ns = namespaces[i % 30]
            body = f'{{"step": {i}}}'.encode()
            saved[ns].append((client.save(ns, {"state.json": body}).id, body))
        big = random.Random(5).randbytes(3 << 20)  # past one-request saves: an upload
        upload_ns = namespaces[7]
        big_id = client.save(upload_ns, {"model.bin": big}).id
    assert _forwarded(cluster) == [0, 0, 0]  # HAProxy's shard is ours, uploads included
    wait_for(  # the load each owner's beat carries adds up to what was saved
        "301 checkpoints in the cluster's totals",
        lambda: cluster.state(1)["totals"]["checkpoints"] == 301,
        timeout=10,
    )

    for k, node in enumerate(cluster.nodes):  # a node's own: what its data dir holds
        own = {"X-Ckpt-Forwarded": "test"}
        status, body = call(node.url, node.token, "GET", "/v1/namespaces", headers=own)
        assert status == 200
        listed = {n["name"] for n in body["namespaces"]}
        assert listed == {ns for ns in namespaces if shard_of(ns, 3) == k}
    for url in [cluster.proxy.url, *(n.url for n in cluster.nodes)]:  # the whole, anywhere
        status, body = call(url, cluster.token, "GET", "/v1/namespaces")
        assert status == 200
        assert [n["name"] for n in body["namespaces"]] == sorted(namespaces)

    for url in [cluster.proxy.url, *(n.url for n in cluster.nodes)]:
        with VaultClient(url, cluster.token, progress=False) as client:
            for ns, saves in saved.items():
                ids = {c.id for c in client.list(ns)}
                assert {i for i, _ in saves} <= ids
                ckpt_id, body = saves[-1]
                assert client.read_range(ns, ckpt_id, "state.json", 0, len(body)) == body
            assert client.read_range(upload_ns, big_id, "model.bin", 0, len(big)) == big
    assert sum(_forwarded(cluster)) > 0  # the nodes' reads of other shards took a hop


def test_coalesced_saves_cli_and_langgraph_through_the_proxy(
    cluster: Cluster, tmp_path: Path
) -> None:
    async def producers() -> list[tuple[str, str]]:
        async with AsyncVaultClient(cluster.proxy.url, cluster.token, progress=False) as c:

            async def one(i: int) -> tuple[str, str]:
                ns = f"agent-{i % 12}"
                return ns, (await c.save(ns, {"s.json": f'{{"i": {i}}}'.encode()})).id

            return await asyncio.gather(*(one(i) for i in range(120)))

    made = asyncio.run(producers())
    with VaultClient(cluster.proxy.url, cluster.token, progress=False) as client:
        for ns, ckpt_id in made:
            assert client.get(ns, ckpt_id).id == ckpt_id

    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(b"cli" * 1000)
    env_args = ["--url", cluster.proxy.url, "--token", cluster.token]
    done = subprocess.run(
        [sys.executable, "-m", "checkpoint_vault.cli", *env_args, "push", "cli/ns", str(src)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "checkpoint_vault.cli",
            *env_args,
            "pull",
            "cli/ns",
            "latest",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert [p.read_bytes() for p in out.rglob("w.bin")] == [b"cli" * 1000]

    from langgraph.checkpoint.base import empty_checkpoint

    from checkpoint_vault.client.langgraph import VaultSaver

    with VaultSaver(cluster.proxy.url, cluster.token) as saver:
        for t in range(6):
            cfg: Any = {"configurable": {"thread_id": f"thread-{t}", "checkpoint_ns": ""}}
            ckpt = empty_checkpoint()
            ckpt["channel_values"] = {"messages": [f"hello {t}"]}
            ckpt["channel_versions"] = {"messages": 1}
            saved = saver.put(cfg, ckpt, {"step": 1}, {"messages": 1})
            got = saver.get_tuple(saved)
            assert got is not None
            assert got.checkpoint["channel_values"] == {"messages": [f"hello {t}"]}


def test_shard_processes_with_workers(tmp_path: Path, seaweed: SeaweedFS) -> None:
    """`ckpt serve --workers 2` per shard (the default on two cores): a worker routes by
    the beats its writing process publishes, forwards another shard's requests itself,
    and a chunked upload reaches its shard's writing process through the proxy."""
    cluster = Cluster(tmp_path, seaweed, secrets.token_hex(4), shards=2, workers=2)
    try:
        cluster.start()
        namespaces = [f"w-{i}" for i in range(8)]
        big = random.Random(9).randbytes(3 << 20)
        made = []
        with VaultClient(cluster.proxy.url, cluster.token, progress=False) as client:
            for i in range(40):
                ns = namespaces[i % 8]
                made.append((ns, client.save(ns, {"s.json": b'{"i": %d}' % i}).id))
            big_id = client.save(namespaces[3], {"model.bin": big}).id
        for node in cluster.nodes:
            with VaultClient(node.url, cluster.token, progress=False) as client:
                for ns, ckpt_id in made:
                    assert client.get(ns, ckpt_id).id == ckpt_id
                assert client.read_range(namespaces[3], big_id, "model.bin", 0, len(big)) == big
        # the whole's stats, gathered once (by the worker or the writer that answers)
        own = [
            call(n.url, cluster.token, "GET", "/v1/stats", headers={"X-Ckpt-Forwarded": "t"})[1]
            for n in cluster.nodes
        ]
        assert sum(s["checkpoints"] for s in own) == 41
        for url in [cluster.proxy.url] * 4 + [n.url for n in cluster.nodes] * 2:
            status, whole = call(url, cluster.token, "GET", "/v1/stats")
            assert (status, whole["checkpoints"]) == (200, 41), whole
            status, history = call(url, cluster.token, "GET", "/v1/stats/history")
            assert status == 200, history
    finally:
        cluster.stop()
