"""The whole cluster from any node (issue 43, part 2): `GET /v1/cluster` and `ckpt cluster
status` name the three nodes, the shards and their owners; a token made through one node
works on all, a revoked one fails on all within 5 s; a killed node shows down within 10 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from checkpoint_vault.client import VaultClient
from checkpoint_vault.cluster import shard_of

from ..cluster import TTL, Cluster, call, wait_for

pytestmark = pytest.mark.slow  # every test here takes over a second (the quick loop skips them)


def ckpt(url: str, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "checkpoint_vault.cli", "--url", url, "--token", token, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _status(url: str, token: str) -> dict[str, Any]:
    done = ckpt(url, token, "cluster", "status", "--json")
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def test_status_from_any_node_and_through_the_proxy(cluster: Cluster) -> None:
    for url in [cluster.proxy.url, *(n.url for n in cluster.nodes)]:
        state = _status(url, cluster.token)
        assert [n["node"] for n in state["nodes"]] == ["n0", "n1", "n2"]
        assert all(n["up"] for n in state["nodes"])
        owners = [(s["shard"], s["owner"], s["epoch"]) for s in state["shard_owners"]]
        assert owners == [(0, "n0", 0), (1, "n1", 0), (2, "n2", 0)]
        assert all(s["lag_seconds"] is not None for s in state["shard_owners"])
    table = ckpt(cluster.nodes[1].url, cluster.token, "cluster", "status")
    assert table.returncode == 0, table.stderr
    assert "3 nodes, 3 shards (seen from n1): 0 checkpoints" in table.stdout
    assert all(f"n{k}" in table.stdout for k in range(3))

    cluster.nodes[2].kill()
    took = wait_for(
        "n2 shown down",
        lambda: (
            not next(
                n
                for n in _status(cluster.nodes[0].url, cluster.token)["nodes"]
                if n["node"] == "n2"
            )["up"]
        ),
        timeout=10,
    )
    assert took <= TTL + 2
    state = _status(cluster.nodes[0].url, cluster.token)
    assert state["shard_owners"][2]["owner"] is None  # no standby in this test: nobody took it
    lost = next(f"ns-{i}" for i in range(100) if shard_of(f"ns-{i}", 3) == 2)
    status, body = call(
        cluster.nodes[0].url, cluster.token, "GET", f"/v1/namespaces/{lost}/checkpoints"
    )
    assert (status, body["error"]["code"]) == (503, "unavailable")  # retried, never wrong
    # the whole is refused rather than short of a shard, and a default policy changes
    # nowhere rather than on some shards
    status, body = call(cluster.nodes[0].url, cluster.token, "GET", "/v1/stats")
    assert (status, body["error"]["code"]) == (503, "unavailable")
    keep = {"retention": {"keep_last": 9}}
    status, body = call(cluster.nodes[0].url, cluster.token, "PUT", "/v1/policy/default", keep)
    assert (status, body["error"]["code"]) == (503, "unavailable")
    own = {"X-Ckpt-Forwarded": "test"}
    for node in cluster.nodes[:2]:
        status, body = call(node.url, cluster.token, "GET", "/v1/policy/default", headers=own)
        assert status == 200, body
        assert body["retention"]["keep_last"] != 9


def test_tokens_are_the_clusters(cluster: Cluster) -> None:
    _, b, c = cluster.nodes
    with VaultClient(b.url, cluster.token, progress=False) as client:
        secret = client.create_token("producer", ["read:*", "write:*"]).token
    took = wait_for(
        "the new token accepted on every node",
        lambda: all(call(n.url, secret, "GET", "/v1/namespaces")[0] == 200 for n in cluster.nodes),
        timeout=5,
    )
    with VaultClient(cluster.proxy.url, secret, progress=False) as client:
        client.save("tok/ns", {"a.txt": b"hello"})

    with VaultClient(c.url, cluster.token, progress=False) as client:
        client.revoke_token("producer")
    took_revoke = wait_for(
        "the revoked token refused on every node",
        lambda: all(call(n.url, secret, "GET", "/v1/namespaces")[0] == 401 for n in cluster.nodes),
        timeout=5,
    )
    print(f"token everywhere in {took:.2f} s, revoked everywhere in {took_revoke:.2f} s")
