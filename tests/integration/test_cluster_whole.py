"""The whole cluster from any node (issue 43): stats, usage and the storage chart's history
are the sums over the shards, from every node and through the proxy; a namespace's policy
lands on its owner from any node, and the default policy on every shard. One 3-node
cluster for the module."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

from checkpoint_vault.client import VaultClient
from checkpoint_vault.cluster import shard_of

from ..cluster import Cluster, call, wait_for
from ..seaweed import SeaweedFS
from .test_cluster_status import ckpt

pytestmark = pytest.mark.slow  # a cluster takes seconds to start (the quick loop skips it)

BURST = 20  # a token's requests per node before 429 (refilled at 0.01 per second)
OWN = {"X-Ckpt-Forwarded": "test"}  # what processes send each other: one's own answer
# two namespaces on each of the three shards, of different sizes
NAMESPACES = [
    ns
    for k in range(3)
    for ns in [n for n in (f"whole-{i}" for i in range(100)) if shard_of(n, 3) == k][:2]
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, seaweed: SeaweedFS) -> Iterator[Cluster]:
    extra = (
        '[quotas]\n"whole-*" = "1GiB"\n'  # enforced by each shard over its own namespaces
        f"[limits]\nrequests_per_second = 0.01\nburst = {BURST}\n"  # admins are exempt
    )
    c = Cluster(tmp_path_factory.mktemp("whole"), seaweed, secrets.token_hex(4), extra=extra)
    try:
        c.start()
        with VaultClient(c.proxy.url, c.token, progress=False) as client:
            for i, ns in enumerate(NAMESPACES):
                for j in range(i + 1):
                    client.save(ns, {"w.bin": secrets.token_bytes(1000 * (i + 1) + j)})
        yield c
    finally:
        c.stop()


def own(cluster: Cluster, k: int, path: str) -> Any:
    """Shard k's owner's own answer (node k owns shard k)."""
    status, body = call(cluster.nodes[k].url, cluster.token, "GET", path, headers=OWN)
    assert status == 200, body
    return body


def urls(cluster: Cluster) -> list[str]:
    return [cluster.proxy.url, *(n.url for n in cluster.nodes)]


def test_stats_usage_and_history_are_the_sums_over_shards(cluster: Cluster) -> None:
    shards = [own(cluster, k, "/v1/stats?namespaces=true") for k in range(3)]
    assert [s["checkpoints"] for s in shards] == [1 + 2, 3 + 4, 5 + 6]  # every shard saved
    for k, s in enumerate(shards):
        assert sorted(s["by_namespace"]) == sorted(NAMESPACES[2 * k : 2 * k + 2])
    summed = ("checkpoints", "namespaces", "logical_bytes", "stored_bytes", "chunks")
    for url in urls(cluster):
        status, whole = call(url, cluster.token, "GET", "/v1/stats?namespaces=true")
        assert status == 200, whole
        for key in summed:
            assert whole[key] == sum(s[key] for s in shards), key
        assert whole["tiers"]["hot"]["bytes"] == sum(s["tiers"]["hot"]["bytes"] for s in shards)
        assert whole["disk_bytes"] > max(s["disk_bytes"] for s in shards)
        assert whole["dedup_ratio"] == round(whole["logical_bytes"] / whole["stored_bytes"], 4)
        assert sorted(whole["by_namespace"]) == sorted(NAMESPACES)
        assert whole["quotas"] == [
            {"glob": "whole-*", "limit": 1 << 30, "used": s["logical_bytes"], "shard": k}
            for k, s in enumerate(shards)
        ]
        assert all("shard" not in q for s in shards for q in s["quotas"])  # one process's
        for k, s in enumerate(shards):
            for ns, usage in s["by_namespace"].items():
                assert whole["by_namespace"][ns] == usage, (k, ns)

    # the usage scans above took a sample on every shard: the chart's newest point is
    # the sum of every shard's newest sample
    newest = [own(cluster, k, "/v1/stats/history")["samples"][-1] for k in range(3)]
    for url in urls(cluster):
        status, history = call(url, cluster.token, "GET", "/v1/stats/history?limit=5")
        assert status == 200, history
        assert 1 <= len(history["samples"]) <= 5
        point = history["samples"][-1]
        assert point["at"] == max(s["at"] for s in newest)
        for key in ("logical_bytes", "stored_bytes", "disk_bytes"):
            assert point[key] == sum(s[key] for s in newest), key
        assert point["logical_bytes"] == sum(s["logical_bytes"] for s in shards)
        assert sorted(point["namespaces"]) == sorted(NAMESPACES)

    # what gathering costs: one node's own stats against the whole from that node
    took = {}
    for name, headers in (("own", OWN), ("whole", None)):
        start = time.perf_counter()
        for _ in range(20):
            assert (
                call(cluster.nodes[0].url, cluster.token, "GET", "/v1/stats", None, headers)[0]
                == 200
            )
        took[name] = (time.perf_counter() - start) / 20 * 1000
    print(f"GET /v1/stats: {took['own']:.1f} ms one shard, {took['whole']:.1f} ms the whole of 3")

    # and the CLI's `ckpt stats` through the proxy reads the same whole
    done = ckpt(cluster.proxy.url, cluster.token, "stats", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["checkpoints"] == 21 == sum(s["checkpoints"] for s in shards)


def test_policies_are_the_clusters(cluster: Cluster) -> None:
    ns = NAMESPACES[4]  # on shard 2
    done = ckpt(cluster.nodes[0].url, cluster.token, "retention", "set", ns, "--keep-last", "3")
    assert done.returncode == 0, done.stderr
    assert own(cluster, 2, f"/v1/namespaces/{ns}/policy")["retention"]["keep_last"] == 3
    ns = NAMESPACES[0]  # on shard 0, set through the proxy
    done = ckpt(cluster.proxy.url, cluster.token, "retention", "set", ns, "--keep-last", "4")
    assert done.returncode == 0, done.stderr
    assert own(cluster, 0, f"/v1/namespaces/{ns}/policy")["retention"]["keep_last"] == 4

    for n, url in enumerate([cluster.nodes[1].url, cluster.proxy.url]):
        done = ckpt(url, cluster.token, "retention", "set", "--keep-last", str(7 + n))
        assert done.returncode == 0, done.stderr
        for k in range(3):
            assert own(cluster, k, "/v1/policy/default")["retention"]["keep_last"] == 7 + n, k


def test_a_forwarded_request_is_charged_once(cluster: Cluster) -> None:
    """By the shard's owner only: the node that passes it on does not charge the token."""
    with VaultClient(cluster.nodes[0].url, cluster.token, progress=False) as client:
        secret = client.create_token("limited", ["read:*"]).token
    wait_for(  # asked with the admin token: polling with `secret` would spend its allowance
        "the token on every node",
        lambda: all(
            "limited" in json.dumps(call(n.url, cluster.token, "GET", "/v1/admin/tokens")[1])
            for n in cluster.nodes
        ),
        timeout=5,
    )
    here, there = NAMESPACES[0], NAMESPACES[2]  # shards 0 and 1
    a, b = cluster.nodes[0], cluster.nodes[1]

    def ok(url: str, ns: str) -> bool:
        status, body = call(url, secret, "GET", f"/v1/namespaces/{ns}/checkpoints")
        assert status in (200, 429), body
        return status == 200

    assert all(ok(a.url, here) for _ in range(BURST // 2))  # half of n0's allowance
    # through n0 to shard 1's owner: n1's allowance, not n0's half left
    assert all(ok(a.url, there) for _ in range(BURST))
    assert not ok(b.url, there)  # n1's allowance is spent: charged once each, there
    assert ok(a.url, here)  # and n0 still has what the forwarded requests did not take
