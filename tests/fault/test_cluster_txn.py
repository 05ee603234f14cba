"""A commit across three namespaces on three shards, with the owner of one of them
SIGKILLed at random moments (issue 44, "a commit across namespaces").

Three shard processes over SeaweedFS behind HAProxy (tests/cluster.py). A producer makes
`CKPT_TXN_ROUNDS` (20) commits through the proxy with `VaultClient.commit_all`, each one
file per namespace, while the owner of the first namespace is SIGKILLed `CKPT_TXN_KILLS`
(2) times at random moments and restarted on its disk (`CKPT_TXN_WORKERS=2`: every shard
process with a worker, whose reads wait for its writing process to apply a decided
transaction). Then every commit is checked:
- acknowledged: the three checkpoints it answered exist, with its bytes;
- not acknowledged: once prepared uploads are resolved (decided ones applied, undecided
  ones aborted after `txn_timeout`), all three namespaces hold its checkpoint or none does.
Meanwhile a reader reads the three namespaces' latest checkpoints in turn, over and over:
once it saw commit i in the first, the next two must show i or later (a commit is visible
in one namespace only once decided, and a read of another applies its part first).
"""

from __future__ import annotations

import os
import random
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.errors import ClientError, TransportError
from checkpoint_vault.cluster import shard_of

from ..cluster import Cluster, call, wait_for
from ..seaweed import SeaweedFS

ROUNDS = int(os.environ.get("CKPT_TXN_ROUNDS", "20"))
KILLS = int(os.environ.get("CKPT_TXN_KILLS", "2"))
WORKERS = int(os.environ.get("CKPT_TXN_WORKERS", "1"))  # 2: reads answered by workers too
TIMEOUT = 2.0  # seconds: [cluster] txn_timeout here (an undecided upload is aborted after)


@pytest.fixture
def txn_cluster(tmp_path: Path, seaweed: SeaweedFS) -> Iterator[Cluster]:
    extra = f'txn_timeout = "{TIMEOUT}s"\n'
    c = Cluster(tmp_path, seaweed, secrets.token_hex(4), workers=WORKERS, extra=extra)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def _spread(shards: int) -> list[str]:
    """One namespace per shard: the agents of one system."""
    found: dict[int, str] = {}
    for i in range(1000):
        found.setdefault(shard_of(f"system/agent-{i}", shards), f"system/agent-{i}")
        if len(found) == shards:
            break
    return [found[k] for k in range(shards)]


def _body(ns: str, attempt: int) -> bytes:
    return f"{ns} attempt {attempt} ".encode() * 50


class Producer(threading.Thread):
    def __init__(self, url: str, token: str, names: list[str]) -> None:
        super().__init__(daemon=True)
        self.url, self.token, self.names = url, token, names
        self.acked: dict[int, dict[str, str]] = {}  # attempt -> namespace -> checkpoint id
        self.failed: dict[int, str] = {}
        self.attempt = 0

    def run(self) -> None:
        with VaultClient(self.url, self.token, progress=False, local_files=False) as client:
            for i in range(ROUNDS):
                self.attempt = i
                saves = {ns: {"state.bin": _body(ns, i)} for ns in self.names}
                try:
                    done = client.commit_all(saves, metadata={"attempt": i})
                except (ClientError, TransportError) as e:
                    self.failed[i] = f"{type(e).__name__}: {e}"
                    continue
                self.acked[i] = {ns: c.id for ns, c in done.items()}


class Reader(threading.Thread):
    """Reads the namespaces' latest checkpoints one after the other until stopped."""

    def __init__(self, url: str, token: str, names: list[str]) -> None:
        super().__init__(daemon=True)
        self.url, self.token, self.names = url, token, names
        self.stop = threading.Event()
        self.rounds = 0
        self.violations: list[list[int]] = []

    def latest(self, ns: str) -> int | None:
        """The attempt of `ns`'s latest checkpoint (-1: none), None if it did not answer."""
        try:
            status, body = call(
                self.url, self.token, "GET", f"/v1/namespaces/{ns}/checkpoints/latest"
            )
        except (OSError, ValueError):  # the proxy's own page while no server is up
            return None
        if status == 404 and body["error"]["code"] == "not_found":
            return -1
        return int(body["metadata"]["attempt"]) if status == 200 else None

    def run(self) -> None:
        while not self.stop.is_set():
            seen = [self.latest(ns) for ns in self.names]
            if any(s is None for s in seen):
                continue  # an owner down: this round says nothing
            self.rounds += 1
            first, *later = (s for s in seen if s is not None)
            if any(s < first for s in later):
                self.violations.append([s for s in seen if s is not None])


def _attempts(cluster: Cluster, ns: str) -> dict[int, str] | None:
    """Attempt -> checkpoint id of every checkpoint of `ns`, through the proxy (None while
    its shard does not answer)."""
    status, body = call(
        cluster.proxy.url, cluster.token, "GET", f"/v1/namespaces/{ns}/checkpoints?limit=1000"
    )
    if status != 200:
        return None
    return {int(c["metadata"]["attempt"]): c["id"] for c in body["checkpoints"]}


@pytest.mark.slow
def test_commit_across_shards_is_all_or_nothing_through_owner_kills(
    txn_cluster: Cluster,
) -> None:
    cluster = txn_cluster
    names = _spread(cluster.shards)
    victim = cluster.nodes[shard_of(names[0], cluster.shards)]
    rng = random.Random(int(os.environ.get("CKPT_TXN_SEED", "44")))
    producer = Producer(cluster.proxy.url, cluster.token, names)
    reader = Reader(cluster.proxy.url, cluster.token, names)
    reader.start()
    producer.start()
    moments = sorted(rng.sample(range(1, max(ROUNDS - 2, KILLS + 1)), KILLS))
    for moment in moments:
        wait_for(f"attempt {moment}", lambda m=moment: producer.attempt >= m, timeout=120)
        time.sleep(rng.uniform(0, 0.15))  # a random moment inside the commit, not a sync
        victim.kill()
        victim.start()  # on its disk: it resumes as its shard's owner
    producer.join(timeout=300)
    reader.stop.set()
    reader.join(timeout=60)
    assert not producer.is_alive()
    print(f"\n{len(producer.acked)} of {ROUNDS} acknowledged; failed: {producer.failed}")
    print(f"reader: {reader.rounds} rounds of three reads, {len(reader.violations)} partial")
    assert not reader.violations, reader.violations[:5]
    assert len(producer.acked) >= ROUNDS - 2 * KILLS - 2, producer.failed

    seen: dict[str, dict[int, str]] = {}

    def settled() -> bool:
        for ns in names:
            got = _attempts(cluster, ns)
            if got is None:
                return False
            seen[ns] = got
        return all(
            len({a in seen[ns] for ns in names}) == 1 for a in range(ROUNDS)
        )  # every attempt in all three or in none

    wait_for("every attempt all or nothing", settled, timeout=TIMEOUT * 10 + 30)
    for attempt, ids in producer.acked.items():
        for ns, cid in ids.items():
            assert seen[ns].get(attempt) == cid, (attempt, ns)
            status, _ = call(
                cluster.proxy.url, cluster.token, "GET", f"/v1/namespaces/{ns}/checkpoints/{cid}"
            )
            assert status == 200
    with VaultClient(cluster.proxy.url, cluster.token, progress=False) as client:
        for ns in names:
            for attempt, cid in seen[ns].items():
                got = client.read_range(ns, cid, "state.bin", 0, 1 << 20)
                assert got == _body(ns, attempt)
