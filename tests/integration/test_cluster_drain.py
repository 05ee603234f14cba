"""Shards moved between live nodes under load (issue 43, part 4).

Producers save through the proxy while `ckpt cluster drain n0` moves n0's shard to its
standby on n1, then `ckpt cluster move 1 n2` moves shard 1 to its standby on n2, then
`ckpt cluster add n0` gives n0 back its share (shard 2, whose standby it runs). A move is
the planned form of a takeover: the owner stops taking writes (503, which the client
retries as asked) once the replica holds all it acknowledged, the standby is promoted.
Producers see no error (the client absorbs the pause), every acknowledged save reads back
through the proxy, and the old owners, holding nothing, forward what still reaches them.
"""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.client import VaultClient
from checkpoint_vault.cluster import shard_of

from ..cluster import NAMESPACES, Cluster, Producers, call, wait_for
from ..seaweed import SeaweedFS


@pytest.fixture
def cluster(tmp_path: Path, seaweed: SeaweedFS) -> Iterator[Cluster]:
    c = Cluster(tmp_path, seaweed, secrets.token_hex(4), standbys=True)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def ckpt(cluster: Cluster, *args: str) -> str:
    done = subprocess.run(
        [
            sys.executable, "-m", "checkpoint_vault.cli",
            "--url", cluster.nodes[1].url, "--token", cluster.token, *args,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_drain_and_move_under_load_lose_nothing(cluster: Cluster) -> None:
    with Producers(cluster.proxy.url, cluster.token) as producers:
        wait_for("producers saving", lambda: producers.count() >= 20)
        drained = ckpt(cluster, "cluster", "drain", "n0")
        assert re.search(r"moved shard 0 from n0 to n1 at epoch 1 in [\d.]+ s", drained)
        mark = producers.count()
        wait_for("producers saving after the drain", lambda: producers.count() >= mark + 20)
        moved = ckpt(cluster, "cluster", "move", "1", "n2")
        assert re.search(r"moved shard 1 from n1 to n2 at epoch 1 in [\d.]+ s", moved)
        mark = producers.count()
        wait_for("producers saving after the move", lambda: producers.count() >= mark + 20)
        assert [s["owner"] for s in cluster.state(1)["shard_owners"]] == ["n1", "n2", "n2"]
        assert ckpt(cluster, "cluster", "drain", "n0").strip() == "n0 owns no shard"
        # n0 still runs shard 2's standby: adding it back takes that shard off n2
        added = ckpt(cluster, "cluster", "add", "n0")
        assert re.search(r"moved shard 2 from n2 to n0 at epoch 1 in [\d.]+ s", added), added
        mark = producers.count()
        wait_for("producers saving after the add", lambda: producers.count() >= mark + 20)
    print(drained, moved, added, f"{len(producers.acked)} saves")
    assert producers.errors == []
    owners = [s["owner"] for s in cluster.state(1)["shard_owners"]]
    assert owners == ["n1", "n2", "n0"]

    with VaultClient(cluster.proxy.url, cluster.token, progress=False) as client:
        for ns, ckpt_id, body in producers.acked:
            assert client.read_range(ns, ckpt_id, "state.json", 0, len(body)) == body
    old = cluster.nodes[0]  # released shard 0: reads and writes reach the new owner
    ns = next(n for n in NAMESPACES if shard_of(n, cluster.shards) == 0)
    with VaultClient(old.url, cluster.token, progress=False) as client:
        made = client.save(ns, {"late.json": b"{}"})
        assert client.get(ns, made.id).id == made.id

    # the whole from every process, released ones too (the proxy's `any` backend sends
    # them admin requests): each shard counted once, from its owner
    own = {"X-Ckpt-Forwarded": "test"}
    owners = [
        p for p in cluster.processes() if call(p.url, "", "GET", "/v1/cluster/primary")[0] == 200
    ]
    assert len(owners) == 3
    shards = [call(p.url, cluster.token, "GET", "/v1/stats", headers=own)[1] for p in owners]
    names = sorted(
        n["name"]
        for p in owners
        for n in call(p.url, cluster.token, "GET", "/v1/namespaces", headers=own)[1]["namespaces"]
    )
    for proc in cluster.processes():
        status, whole = call(proc.url, cluster.token, "GET", "/v1/stats")
        assert status == 200, whole
        assert whole["checkpoints"] == sum(s["checkpoints"] for s in shards), proc.url
        status, listed = call(proc.url, cluster.token, "GET", "/v1/namespaces")
        assert [n["name"] for n in listed["namespaces"]] == names, proc.url
    keep = {"retention": {"keep_last": 11}}
    status, body = call(old.url, cluster.token, "PUT", "/v1/policy/default", keep)
    assert status == 200, body
    assert body["retention"]["keep_last"] == 11
    for p in owners:
        status, body = call(p.url, cluster.token, "GET", "/v1/policy/default", headers=own)
        assert body["retention"]["keep_last"] == 11, p.url
