"""GC of the shared tier across nodes (issue 44; vault/content/sharedgc.py): two shard
processes over one SeaweedFS, one shared tier. What B's checkpoints still use stays when
A's go; once B's go too, the shared tier returns to its size before the first save; and
SIGKILLs of a random node during tiering and GC lose nothing acknowledged.

Before this change a listed pack was never deleted: the shared tier only grew, and the
first test's second half fails (the tier keeps every byte)."""

from __future__ import annotations

import hashlib
import os
import random
import secrets
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.errors import ClientError, TransportError
from checkpoint_vault.cluster.shards import shard_of
from checkpoint_vault.protocol import GcReport
from checkpoint_vault.tiering import open_tier

from ..cluster import Cluster, wait_for
from ..seaweed import SeaweedFS
from ..serverproc import ServerProcess

pytestmark = pytest.mark.slow

MIB = 1 << 20
# 24 MiB by default (the 256 MiB: CKPT_SHARED_GC_MIB=256)
SIZE = int(os.environ.get("CKPT_SHARED_GC_MIB", "24")) * MIB
ROUNDS = int(os.environ.get("CKPT_GC_ROUNDS", "10"))
# The shared tier's grace (1 s, counted in the store's whole seconds), a node's own GC's
# none, and upload sessions (which reserve their chunks while they live) of 5 s (more
# for bigger sizes).
TTL = max(5, SIZE // (8 * MIB))  # seconds: longer than a save of SIZE takes here
EXTRA = f'shared_gc_grace = "1s"\n[gc]\ngrace = "0s"\n[uploads]\nttl = "{TTL}s"\n'


@pytest.fixture
def cluster(tmp_path: Path, seaweed: SeaweedFS) -> Iterator[Cluster]:
    c = Cluster(tmp_path, seaweed, secrets.token_hex(4), shards=2, shared=True, extra=EXTRA)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def _namespaces(shard: int, count: int) -> list[str]:
    names = [f"train/run-{i}" for i in range(200)]
    return [n for n in names if shard_of(n, 2) == shard][:count]


def _stored(seaweed: SeaweedFS, prefix: str) -> int:
    tier = open_tier("probe", f"s3://vault/{prefix}", seaweed.options())
    return sum(tier.head(k) or 0 for k in tier.list(""))


def _demote(client: VaultClient, ns: str) -> None:
    client.set_policy(ns, {"tiering": {"target": "shared", "keep_hot_last": 0}})
    client.tiering(dry_run=False)


def _digest(client: VaultClient, ns: str, ckpt: str, name: str) -> str:
    h = hashlib.sha256()
    with client.open(ns, ckpt, name) as f:
        while block := f.read(8 << 20):
            h.update(block)
    return h.hexdigest()


def _write(path: Path, size: int, seed: int) -> str:
    rng = random.Random(seed)
    h = hashlib.sha256()
    with path.open("wb") as f:
        for _ in range(0, size, 4 * MIB):
            block = rng.randbytes(min(4 * MIB, size))
            h.update(block)
            f.write(block)
    return h.hexdigest()


def _gc_everywhere(nodes: list[ServerProcess], token: str) -> list[GcReport]:
    out = []
    for node in nodes:
        with VaultClient(node.url, token, progress=False) as c:
            out.append(c.gc())
    return out


def _gc_until(
    what: str, nodes: list[ServerProcess], token: str, done: object, timeout: float = 90.0
) -> list[GcReport]:
    """GC on every node, again and again, until `done()` holds (bounded)."""
    reports: list[GcReport] = []

    def once() -> bool:
        reports.extend(_gc_everywhere(nodes, token))
        return bool(done())  # type: ignore[operator]

    try:
        wait_for(what, once, timeout)
    except AssertionError as e:
        raise AssertionError(f"{e}; the last reports: {reports[-len(nodes) :]}") from None
    return reports


def test_gc_on_every_node_keeps_what_b_uses_and_then_returns_the_bucket(
    cluster: Cluster, seaweed: SeaweedFS, tmp_path: Path
) -> None:
    ns_a, ns_b = _namespaces(0, 1)[0], _namespaces(1, 1)[0]
    node_a, node_b = cluster.nodes
    shared = f"{cluster.run}/shared"
    digest = _write(tmp_path / "model.bin", SIZE, 44)
    _write(tmp_path / "own.bin", SIZE // 4, 45)  # A's alone
    shared_before = _stored(seaweed, shared)
    whole_before = _stored(seaweed, cluster.run)

    with (
        VaultClient(node_a.url, cluster.token, progress=False) as a,
        VaultClient(node_b.url, cluster.token, progress=False) as b,
    ):
        first = a.save(ns_a, {"model.bin": tmp_path / "model.bin"}).id
        _demote(a, ns_a)
        # A's own file in packs of its own (GC deletes whole packs; the shared tier is
        # not repacked, so a pack half named stays whole)
        mine = a.save(ns_a, {"own.bin": tmp_path / "own.bin"}).id
        _demote(a, ns_a)
        second = b.save(ns_b, {"model.bin": tmp_path / "model.bin"}).id
        assert b.transfer.bytes_sent <= 0.05 * SIZE  # found in the shared index
        _demote(b, ns_b)
        assert b.get(ns_b, second).tier == "shared"
        peak = _stored(seaweed, shared)
        whole_peak = _stored(seaweed, cluster.run)
        assert peak >= SIZE + SIZE // 4

        a.delete(ns_a, first)
        a.delete(ns_a, mine)
        started = time.monotonic()
        # A's own file goes; the model's packs stay, named by B's mark
        _gc_until(
            "A's own packs deleted",
            cluster.nodes,
            cluster.token,
            lambda: _stored(seaweed, shared) <= peak - SIZE // 4 * 0.9,
        )
        first_gc = time.monotonic() - started
        after_a = _stored(seaweed, shared)
        assert after_a >= SIZE
        assert _digest(b, ns_b, second, "model.bin") == digest
        with pytest.raises(ClientError):
            a.get(ns_a, first)

        b.delete(ns_b, second)
        started = time.monotonic()
        reports = _gc_until(
            "the shared tier back to its size before the first save",
            cluster.nodes,
            cluster.token,
            lambda: _stored(seaweed, shared) <= shared_before + 0.1 * SIZE,
        )
        second_gc = time.monotonic() - started
    shared_after = _stored(seaweed, shared)
    # the whole bucket too: the replicas rebased once their logs held demoted frames
    wait_for(
        "the whole run prefix back within 10% of one copy of its size before",
        lambda: _stored(seaweed, cluster.run) <= whole_before + 0.1 * SIZE,
        60,
    )
    whole_after = _stored(seaweed, cluster.run)
    deleted = sum(r.shared_packs_deleted or 0 for r in reports)
    print(
        f"\nshared tier {shared_before / MIB:.2f} -> {peak / MIB:.1f} (both saved) -> "
        f"{after_a / MIB:.1f} (A's deleted, {first_gc:.1f} s of GC rounds) -> "
        f"{shared_after / MIB:.2f} MiB (B's deleted, {second_gc:.1f} s, {deleted} packs); "
        f"whole run prefix {whole_before / MIB:.1f} -> {whole_peak / MIB:.1f} -> "
        f"{whole_after / MIB:.1f} MiB"
    )
    assert deleted >= 1
    assert shared_after <= shared_before + 0.1 * SIZE
    # the figures reach /metrics as the GC job's summed results
    metered = sum(_metric(n, cluster.token, "gc_shared_packs_deleted") for n in cluster.nodes)
    assert metered >= deleted


def _metric(node: ServerProcess, token: str, what: str) -> float:
    req = urllib.request.Request(node.url + "/metrics")
    req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith("ckpt_maintenance_result") and f'what="{what}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_sigkills_of_a_random_node_during_gc_lose_nothing_acknowledged(
    cluster: Cluster, seaweed: SeaweedFS
) -> None:
    rng = random.Random(4404)
    spaces = [_namespaces(0, 2), _namespaces(1, 2)]
    acked: list[tuple[int, str, str, dict[str, bytes]]] = []  # node, ns, id, files
    deleted_packs = 0
    cut = 0
    common = rng.randbytes(MIB)  # saved on both nodes: B adopts what A shipped, and back
    started = time.monotonic()
    for n in range(ROUNDS):
        for k, node in enumerate(cluster.nodes):
            with VaultClient(node.url, cluster.token, progress=False) as c:
                ns = rng.choice(spaces[k])
                files = {"own.bin": rng.randbytes(256 << 10), "common.bin": common}
                ckpt = c.save(ns, files).id
                acked.append((k, ns, ckpt, files))
                c.set_policy(ns, {"tiering": {"target": "shared", "keep_hot_last": 0}})
                if n % 3 == 2:  # every third round: forget a third of what is kept
                    for old in [x for x in acked if x[0] == k and rng.random() < 0.34]:
                        c.delete(old[1], old[2])
                        acked.remove(old)
        if n % 4 == 3:  # a new common file now and then: the old one's packs can go
            common = rng.randbytes(MIB)
        victim = rng.randrange(2)
        outcome = _maintenance_with_a_kill(cluster.nodes, victim, cluster.token, rng)
        cut += outcome[0]
        deleted_packs += outcome[1]
        cluster.nodes[victim].start()
        mine = [x for x in acked if x[0] == victim]
        if mine:
            _answers(cluster.nodes[victim], cluster.token, mine[-1][1], mine[-1][2])
    rounds_took = time.monotonic() - started
    shared = _stored(seaweed, f"{cluster.run}/shared")

    reports = _gc_until(
        "a GC round with every shard marked",
        cluster.nodes,
        cluster.token,
        lambda: True,
    )
    deleted_packs += sum(r.shared_packs_deleted or 0 for r in reports)
    read = 0
    for k, ns, ckpt, files in acked:
        with VaultClient(cluster.nodes[k].url, cluster.token, progress=False) as c:
            for name, data in files.items():
                with c.open(ns, ckpt, name) as f:
                    assert f.read() == data, (k, ns, ckpt, name)
                read += len(data)
    print(
        f"\n{ROUNDS} rounds in {rounds_took:.1f} s, {cut} kills inside the run; "
        f"{deleted_packs} shared packs deleted; {len(acked)} checkpoints kept read back "
        f"({read / MIB:.1f} MiB); shared tier {shared / MIB:.1f} MiB"
    )
    assert cut >= ROUNDS // 2  # most kills landed inside a request: a tiering run or a GC
    assert deleted_packs >= 1  # and GC deleted shared packs meanwhile


def _answers(node: ServerProcess, token: str, ns: str, ckpt: str) -> None:
    with VaultClient(node.url, token, progress=False) as c:
        wait_for("the restarted node answering", lambda: c.get(ns, ckpt).id == ckpt, 60)


def _maintenance_with_a_kill(
    nodes: list[ServerProcess], victim: int, token: str, rng: random.Random
) -> tuple[bool, int]:
    """Tiering, then GC again and again, on every node at once; SIGKILL `victim` at a
    random moment, then let the others finish the GC they are in. Whether the kill cut a
    request of the victim's short, and the packs the GC runs deleted."""
    killed = threading.Event()
    cut = threading.Event()
    finished = [threading.Event() for _ in nodes]
    deleted = [0 for _ in nodes]

    def run(k: int) -> None:
        try:
            with VaultClient(nodes[k].url, token, progress=False) as c:
                c.tiering(dry_run=False)
                while not killed.is_set():
                    deleted[k] += c.gc().shared_packs_deleted or 0
            finished[k].set()
        except (ClientError, TransportError):
            if k == victim:
                cut.set()  # the kill cut it short: expected on the victim

    workers = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(len(nodes))]
    for w in workers:
        w.start()
    time.sleep(rng.uniform(0.05, 1.0))  # not synchronisation: the random moment of the kill
    nodes[victim].kill()
    killed.set()
    for w in workers:
        w.join(timeout=120)
    for k in range(len(nodes)):
        assert k == victim or finished[k].is_set(), f"node {k}'s maintenance failed"
    return cut.is_set(), sum(deleted)
