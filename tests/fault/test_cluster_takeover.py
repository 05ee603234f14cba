"""A node SIGKILLed under load, round after round (issue 43, part 3: ten rounds).

Three nodes; each shard has its primary on one node and a standby on the next, both
replicating in sync mode to the shard's prefix of one SeaweedFS; HAProxy in front, its
configuration from `ckpt cluster proxy-config`. Each round, producers save through the
proxy while one node (both of its processes) is SIGKILLed. Then:
- each shard the node owned answers a save through the proxy again within 15 s (its
  standby saw no beat for the lease TTL, promoted itself: caught up from the replica,
  claimed the next epoch; the proxy's check followed);
- every save a producer saw acknowledged, before, during and after, reads back through
  the proxy, and every checkpoint any namespace lists reads back whole (a save the kill
  cut short is absent, never half there);
- the killed owner, restarted on its disk, refuses writes for the shard it lost (409), and
  then rejoins as that shard's standby on a fresh disk; the killed standby rejoins on its
  own disk. The next round starts with every shard owned and standing by again.
The takeover times are printed (`-n 0 -s`), and asserted within the bound.

Four rounds by default: each node is killed once, and from the second round on every round
loses two shards that were taken over before (a standby promoted once is the owner killed
next), so rounds 5-10 repeat round 4's situation at higher epochs. The issue's ten rounds:
CKPT_CLUSTER_ROUNDS=10 (~50 s more).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import blake3
import pytest

from checkpoint_vault.client import VaultClient
from checkpoint_vault.cluster import shard_of
from checkpoint_vault.protocol import BUNDLE_TYPE
from checkpoint_vault.protocol._bodies import encode_bundle

from ..cluster import NAMESPACES, Cluster, Producers, call, wait_for
from ..seaweed import SeaweedFS
from ..serverproc import ServerProcess

ROUNDS = int(os.environ.get("CKPT_CLUSTER_ROUNDS", "4"))
BOUND = 15.0  # seconds: a lost shard answers saves again within this (the bound)


@pytest.fixture
def cluster(tmp_path: Path, seaweed: SeaweedFS) -> Iterator[Cluster]:
    c = Cluster(tmp_path, seaweed, secrets.token_hex(4), standbys=True)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def _probe(url: str, token: str, ns: str) -> bool:
    """One save, one request, no retries: whether it was acknowledged."""
    body = encode_bundle({"namespace": ns}, [("probe.json", b'{"probe": true}')])
    req = urllib.request.Request(f"{url}/v1/namespaces/{ns}/checkpoints", data=body, method="POST")
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Content-Type", BUNDLE_TYPE)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return bool(r.status in (200, 201))
    except (urllib.error.URLError, OSError):
        return False


def _owners(cluster: Cluster) -> dict[int, str]:
    """Shard -> its owner's URL, as a live node sees it."""
    for proc in cluster.processes():
        if proc.alive():
            state = call(proc.url, cluster.token, "GET", "/v1/cluster")[1]
            return {s["shard"]: s["url"] for s in state["shard_owners"]}
    raise AssertionError("no live process")


def _standing(cluster: Cluster) -> bool:
    """Every shard has a live owner and a live standby, as a live primary sees it."""
    state = call(cluster.proxy.url, cluster.token, "GET", "/v1/cluster")[1]
    return all(s["owner"] and s["standbys"] for s in state["shard_owners"])


def _kill_node(cluster: Cluster, v: int) -> list[ServerProcess]:
    """Every process of node n<v>: its first primary and the standby it hosts."""
    killed = [cluster.nodes[v], cluster.standbys[(v - 1) % cluster.shards]]
    for proc in killed:
        proc.kill()
    return killed


def _shard_of_proc(proc: ServerProcess) -> int:
    return int(proc.data_dir.name.split("-s")[1])


def _refuses_writes(cluster: Cluster, proc: ServerProcess) -> None:
    """The killed owner, restarted on its disk as the primary it was: 409 on a write."""
    cluster.reconfigure(proc, standby=False)
    proc.start()
    k = _shard_of_proc(proc)
    ns = next(n for n in NAMESPACES if shard_of(n, cluster.shards) == k)
    body = encode_bundle({"namespace": ns}, [("late.json", b"{}")])
    req = urllib.request.Request(
        f"{proc.url}/v1/namespaces/{ns}/checkpoints", data=body, method="POST"
    )
    req.add_header("Authorization", f"Bearer {cluster.token}")
    req.add_header("Content-Type", BUNDLE_TYPE)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=10)
    refused.value.close()
    assert refused.value.code == 409
    proc.kill()


def _rejoin_as_standby(cluster: Cluster, proc: ServerProcess, fresh: bool) -> None:
    if fresh:
        shutil.rmtree(proc.data_dir)
    cluster.reconfigure(proc, standby=True)
    cluster.start_standby(proc)


@pytest.mark.slow
def test_a_killed_node_loses_nothing_acknowledged(cluster: Cluster) -> None:
    shards = cluster.shards
    times: list[float] = []
    acked_total = 0
    for r in range(ROUNDS):
        victim = r % shards
        owners = _owners(cluster)
        with Producers(cluster.proxy.url, cluster.token) as producers:
            wait_for("producers saving", lambda: producers.count() >= 20)
            killed = _kill_node(cluster, victim)
            killed_urls = {p.url for p in killed}
            lost = [k for k, url in owners.items() if url in killed_urls]
            assert lost, f"round {r}: node n{victim} owned no shard"
            start = time.monotonic()
            for k in lost:
                ns = next(n for n in NAMESPACES if shard_of(n, shards) == k)
                wait_for(
                    f"round {r}: shard {k} saving again",
                    lambda ns=ns: _probe(cluster.proxy.url, cluster.token, ns),  # type: ignore[misc]
                    timeout=BOUND + 15,
                )
                times.append(time.monotonic() - start)
            settled = producers.count()
            wait_for(
                "producers saving after the takeover",
                lambda settled=settled: producers.count() >= settled + 20,  # type: ignore[misc]
            )
        acked_total += len(producers.acked)
        with VaultClient(cluster.proxy.url, cluster.token, progress=False) as client:
            for ns, ckpt_id, body in producers.acked:
                assert client.read_range(ns, ckpt_id, "state.json", 0, len(body)) == body
        for proc in killed:
            was_owner = proc.url in {owners[k] for k in lost}
            if was_owner:
                _refuses_writes(cluster, proc)
            _rejoin_as_standby(cluster, proc, fresh=was_owner)
        wait_for(
            f"round {r}: every shard owned and standing by", lambda: _standing(cluster), timeout=60
        )
        print(
            f"round {r}: killed n{victim}, shards {lost} back in "
            f"{', '.join(f'{t:.2f}' for t in times[-len(lost) :])} s; "
            f"{len(producers.acked)} saves acknowledged, {len(producers.errors)} failed "
            f"{sorted(set(producers.errors))[:3]}"
        )
    print(f"takeover times (s): {sorted(round(t, 2) for t in times)}; {acked_total} saves")
    assert max(times) <= BOUND
    _nothing_half_written(cluster)


def _nothing_half_written(cluster: Cluster) -> None:
    """Every checkpoint any namespace lists, acknowledged or not, reads back whole: a
    save the kill cut short is absent, never half there."""
    with VaultClient(cluster.proxy.url, cluster.token, progress=False) as client:
        for ns in NAMESPACES:
            before = None
            while True:
                page = client.list(ns, limit=500, before=before)
                for listed in page:
                    ckpt = client.get(ns, listed.id)
                    assert ckpt.files
                    for name, info in ckpt.files.items():
                        data = client.read_range(ns, ckpt.id, name, 0, info.size)
                        assert blake3.blake3(data).hexdigest() == info.hash
                        json.loads(data)  # whole JSON, as a producer (or a probe) sent it
                if len(page) < 500:
                    break
                before = page[-1].id
