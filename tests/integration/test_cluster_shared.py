"""One store for the whole cluster (issue 44): two shard processes over one SeaweedFS, with
one shared tier and its chunk index (vault/content/shared.py). The same checkpoint saved
into namespaces of two different owners is packed once: the second producer sends almost
nothing, the shared tier holds one copy, both read back, and GC on either node deletes
nothing the other still names, with a SIGKILL in the middle.

Before this change every node packed into its own prefix and knew only its own packs
(tests/integration/test_two_nodes.py): the second producer sent every byte again and the
bucket held two copies."""

from __future__ import annotations

import hashlib
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
from checkpoint_vault.cluster.shards import shard_of
from checkpoint_vault.tiering import open_tier

from ..cluster import Cluster, wait_for
from ..seaweed import SeaweedFS
from ..serverproc import ServerProcess

pytestmark = pytest.mark.slow

# 64 MiB by default; CKPT_SHARED_MIB=256 is issue 44's size (90 s of the suite at 256).
SIZE = int(os.environ.get("CKPT_SHARED_MIB", "64")) << 20
# The kills' window: 2 s at the issue's 256 MiB, where a tiering run takes longer than that;
# shrunk with the size, so at 64 MiB a kill still lands inside the run.
KILL_WITHIN = 2.0 * SIZE / (256 << 20)
EXTRA = 48 << 20


def _namespaces() -> tuple[str, str]:
    """A namespace of shard 0 and one of shard 1."""
    names = [f"train/run-{i}" for i in range(20)]
    a = next(n for n in names if shard_of(n, 2) == 0)
    b = next(n for n in names if shard_of(n, 2) == 1)
    return a, b


def _write_model(path: Path) -> str:
    """SIZE random bytes (nothing compresses or repeats), written in blocks; the digest."""
    rng = random.Random(44)
    h = hashlib.sha256()
    with path.open("wb") as f:
        for _ in range(SIZE // (16 << 20)):
            block = rng.randbytes(16 << 20)
            h.update(block)
            f.write(block)
    return h.hexdigest()


def _by_folder(seaweed: SeaweedFS, prefix: str) -> dict[str, int]:
    """Bytes per folder two levels down (for a failure's message)."""
    tier = open_tier("probe", f"s3://vault/{prefix}", seaweed.options())
    out: dict[str, int] = {}
    for k in tier.list(""):
        folder = "/".join(k.split("/")[:3])
        out[folder] = out.get(folder, 0) + (tier.head(k) or 0)
    return out


def _stored(seaweed: SeaweedFS, prefix: str) -> int:
    """Bytes under `prefix`, but the shared tier's GC marks (they change at every GC)."""
    tier = open_tier("probe", f"s3://vault/{prefix}", seaweed.options())
    return sum(tier.head(k) or 0 for k in tier.list("") if not k.startswith("gc/"))


@pytest.fixture
def cluster(tmp_path: Path, seaweed: SeaweedFS) -> Iterator[Cluster]:
    c = Cluster(tmp_path, seaweed, secrets.token_hex(4), shards=2, shared=True)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def _demote(client: VaultClient, ns: str) -> None:
    client.set_policy(ns, {"tiering": {"target": "shared", "keep_hot_last": 0}})
    client.tiering(dry_run=False)


def _read(client: VaultClient, ns: str, ckpt: str, digest: str) -> None:
    h = hashlib.sha256()
    with client.open(ns, ckpt, "model.bin") as f:
        while block := f.read(8 << 20):
            h.update(block)
    assert h.hexdigest() == digest


def test_the_same_checkpoint_on_two_owners_is_stored_and_sent_once(
    cluster: Cluster, seaweed: SeaweedFS, tmp_path: Path
) -> None:
    digest = _write_model(tmp_path / "model.bin")
    ns_a, ns_b = _namespaces()
    node_a, node_b = cluster.nodes
    shared = f"{cluster.run}/shared"
    whole_before = _stored(seaweed, cluster.run)

    with VaultClient(node_a.url, cluster.token, progress=False) as a:
        first = a.save(ns_a, {"model.bin": tmp_path / "model.bin"}).id
        sent_a = a.transfer.bytes_sent
        _demote(a, ns_a)
        assert a.get(ns_a, first).tier == "shared"
    one_copy = _stored(seaweed, shared)
    assert one_copy >= SIZE  # random bytes: packed whole, nothing compresses
    whole_after_a = _stored(seaweed, cluster.run)

    with VaultClient(node_b.url, cluster.token, progress=False) as b:
        second = b.save(ns_b, {"model.bin": tmp_path / "model.bin"}).id
        sent_b = b.transfer.bytes_sent
        _demote(b, ns_b)
        assert b.get(ns_b, second).tier == "shared"
    both = _stored(seaweed, shared)
    whole_after_b = _stored(seaweed, cluster.run)
    # the whole bucket: the shards' replicas take a new base once their logs hold mostly
    # frames demoted since (vault/replication/rebase.py), and their old objects go
    try:
        rebased = wait_for(
            "the whole run prefix within 1.1x one copy",
            lambda: _stored(seaweed, cluster.run) - whole_before <= 1.1 * one_copy,
            60 + 60 * SIZE / (256 << 20),
        )
    except AssertionError as e:
        raise AssertionError(f"{e}: {_by_folder(seaweed, cluster.run)}") from None
    whole_rebased = _stored(seaweed, cluster.run)
    print(
        f"\nfirst producer sent {sent_a / 2**20:.1f} MiB, second {sent_b / 2**20:.2f} MiB "
        f"({sent_b / SIZE:.2%}); shared tier {one_copy / 2**20:.1f} MiB after A, "
        f"{both / 2**20:.1f} MiB after B ({both / one_copy:.3f}x); whole run prefix "
        f"(replicas, cluster objects too) {whole_before / 2**20:.1f} -> "
        f"{whole_after_a / 2**20:.1f} -> {whole_after_b / 2**20:.1f} MiB, "
        f"{whole_rebased / 2**20:.1f} MiB {rebased:.1f} s later (new bases)"
    )
    assert sent_a >= SIZE
    assert sent_b <= 0.05 * SIZE
    assert both <= 1.1 * one_copy
    assert whole_after_b - whole_after_a <= 0.1 * (whole_after_a - whole_before)

    with (
        VaultClient(node_a.url, cluster.token, progress=False) as a,
        VaultClient(node_b.url, cluster.token, progress=False) as b,
    ):
        _read(a, ns_a, first, digest)
        _read(b, ns_b, second, digest)

        # A forgets its copy and collects: B's checkpoint names the same packs
        a.delete(ns_a, first)
        a.gc()
        assert _stored(seaweed, shared) == both  # conservative: nothing listed goes
        _read(b, ns_b, second, digest)

        # and new bytes for A's next tiering run to pack, publish and switch
        extra = random.Random(45).randbytes(EXTRA)
        files = {"model.bin": tmp_path / "model.bin", "extra.bin": extra}
        third = a.save(ns_a, files).id  # type: ignore[arg-type]
        a.set_policy(ns_a, {"tiering": {"target": "shared", "keep_hot_last": 0}})

    # SIGKILL A at random moments of its tiering run and GC: nothing acknowledged is lost
    rng = random.Random(4)
    cut = 0
    for _ in range(3):
        cut += _killed_during_maintenance(node_a, cluster.token, rng.uniform(0.05, KILL_WITHIN))
        node_a.start()
        with VaultClient(node_a.url, cluster.token, progress=False) as a:
            wait_for("A's checkpoint answering", lambda: a.get(ns_a, third).id == third, 60)
    assert cut >= 1  # at least one kill landed inside the run, not after it
    with (
        VaultClient(node_a.url, cluster.token, progress=False) as a,
        VaultClient(node_b.url, cluster.token, progress=False) as b,
    ):
        a.tiering(dry_run=False)
        a.gc()
        b.gc()
        assert a.get(ns_a, third).tier == "shared"
        _read(a, ns_a, third, digest)
        with a.open(ns_a, third, "extra.bin") as f:
            assert f.read() == extra
        _read(b, ns_b, second, digest)
        # packs a kill left between upload and publish went; published ones were reused
        assert _stored(seaweed, shared) <= 1.1 * (one_copy + EXTRA)


def _killed_during_maintenance(node: ServerProcess, token: str, after: float) -> bool:
    """Tiering then GC on `node`, SIGKILLed `after` seconds in (a random moment); True if
    the kill cut the run short."""
    finished = threading.Event()

    def run() -> None:
        try:
            with VaultClient(node.url, token, progress=False) as c:
                c.tiering(dry_run=False)
                c.gc()
            finished.set()
        except (ClientError, TransportError):
            pass  # the kill cut it short: expected

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    time.sleep(after)  # not synchronisation: the random moment of the kill
    node.kill()
    worker.join(timeout=120)
    return not finished.is_set()
