"""Compaction of the shared index (vault/content/sharedcompact.py) in a cluster: two shard
processes over one SeaweedFS. GC runs on A merge its one-pack segments while A is
SIGKILLed at random moments; every chunk A shipped stays listed throughout, and B,
started cold, fetches the few merged segments and sends none of A's bytes again.

Before compaction every pack kept its own segment forever: a cold start fetched one
object per pack ever shipped (the segment count below never fell)."""

from __future__ import annotations

import random
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.errors import ClientError, TransportError
from checkpoint_vault.cluster.shards import shard_of
from checkpoint_vault.tiering import open_tier
from checkpoint_vault.vault.content.shared import INDEX_PREFIX, SharedIndex

from ..cluster import Cluster
from ..seaweed import SeaweedFS

pytestmark = pytest.mark.slow

PACKS = 6
KILLS = 3
# A grace long enough for merges (sharedcompact.MIN_GRACE); nothing is deleted here.
EXTRA = 'shared_gc_grace = "10m"\nshared_index_fanin = 2\n[gc]\ngrace = "0s"\n'


@pytest.fixture
def cluster(tmp_path: Path, seaweed: SeaweedFS) -> Iterator[Cluster]:
    c = Cluster(tmp_path, seaweed, secrets.token_hex(4), shards=2, shared=True, extra=EXTRA)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def _namespace(shard: int) -> str:
    return next(n for n in (f"agents/a-{i}" for i in range(100)) if shard_of(n, 2) == shard)


def _listed(seaweed: SeaweedFS, cluster: Cluster) -> tuple[int, set[bytes]]:
    """Segments in the bucket, and every chunk they list (a cold process's view)."""
    tier = open_tier("probe", f"s3://vault/{cluster.run}/shared", seaweed.options())
    index = SharedIndex(tier, "shared", "probe-s9")
    index.refresh()
    segments = [k for k in tier.list(INDEX_PREFIX) if k.endswith(".seg")]
    return len(segments), set(index.lookup(list(index._entries)))


def _gc_killed(node_url: str, token: str, kill: object, rng: random.Random) -> None:
    """GC runs on A until it is SIGKILLed at a random moment."""
    stop = threading.Event()

    def run() -> None:
        try:
            with VaultClient(node_url, token, progress=False) as c:
                while not stop.is_set():
                    c.gc()
        except (ClientError, TransportError):
            pass  # the kill cut it short

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    time.sleep(rng.uniform(0.0, 0.4))  # not synchronisation: the random moment of the kill
    kill()  # type: ignore[operator]
    stop.set()
    worker.join(timeout=60)


def test_merges_killed_at_random_moments_keep_every_chunk_listed(
    cluster: Cluster, seaweed: SeaweedFS
) -> None:
    rng = random.Random(4405)
    node_a, node_b = cluster.nodes
    ns_a, ns_b = _namespace(0), _namespace(1)
    # above the one-request limit (4 MiB), so B asks which chunks it must send
    files = [{"state.bin": rng.randbytes(5 << 20)} for _ in range(PACKS)]
    with VaultClient(node_a.url, cluster.token, progress=False) as a:
        for f in files:  # one tiering run each: one pack and one segment each
            a.save(ns_a, f)
            a.set_policy(ns_a, {"tiering": {"target": "shared", "keep_hot_last": 0}})
            a.tiering(dry_run=False)
    segments, shipped = _listed(seaweed, cluster)
    assert segments == PACKS
    counts = [segments]
    for _ in range(KILLS):
        _gc_killed(node_a.url, cluster.token, node_a.kill, rng)
        node_a.start()
        segments, listed = _listed(seaweed, cluster)
        assert listed == shipped  # nothing A shipped unlisted, whatever the kill cut
        counts.append(segments)
    with VaultClient(node_a.url, cluster.token, progress=False) as a:
        report = a.gc()
    segments, listed = _listed(seaweed, cluster)
    assert listed == shipped
    counts.append(segments)
    assert segments <= 2, counts  # 6 at fan-in 2: merged down to one or two
    print(f"\nsegments in the bucket across the kills: {counts}; last GC {report}")

    node_b.kill()  # B starts cold: it fetches the merged segments
    node_b.start()
    with VaultClient(node_b.url, cluster.token, progress=False) as b:
        for i, f in enumerate(files):
            ckpt = b.save(ns_b, f)
            with b.open(ns_b, ckpt.id, "state.bin") as got:
                assert got.read() == f["state.bin"], i
        total = sum(len(f["state.bin"]) for f in files)
        assert b.transfer.bytes_sent <= 0.05 * total  # found in the shared index
