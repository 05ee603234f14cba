"""A commit of parts that does not wait for shipping (issue 44, M2): two shard processes
over one SeaweedFS with a shared tier, HAProxy in front. The part nodes ship only when
asked (`[uploads] part_ship_delay` of an hour), so the test decides when a part reaches
the shared tier: the commit before it answers `durable: false`, reads go through the
owner to the part's node, `latest-valid?durable=true` skips it, and once the part is
shipped the owner adopts it, flips it to durable and releases the part. A part node
SIGKILLed between the commit and the adoption makes reads of its files 503; restarted
(its config now shipping at once: that test comes last), it ships the claimed part by
itself and adoption ends. A checkpoint deleted before adoption has its parts released.

Before this change the commit always waited for shipping (M1) and no record said
whether it was durable."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.errors import PartUnavailable
from checkpoint_vault.client.transport import RetryPolicy
from checkpoint_vault.cluster.shards import shard_of

from ..cluster import Cluster, call, wait_for
from ..seaweed import SeaweedFS

pytestmark = pytest.mark.slow

DELAY = "part_ship_delay = 3600\n"
EXTRA = "[gc]\ngrace = 0\n[uploads]\n" + DELAY  # shipped when the test asks
SIZE = 1 << 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, seaweed: SeaweedFS) -> Iterator[Cluster]:
    c = Cluster(
        tmp_path_factory.mktemp("durable"), seaweed, secrets.token_hex(4), shards=2,
        shared=True, extra=EXTRA,
    )  # fmt: skip
    try:
        c.start()
        yield c
    finally:
        c.stop()


def _ns(prefix: str) -> str:
    """A namespace owned by node A (nodes[0]): node B's parts travel."""
    return next(n for n in (f"{prefix}-{i}" for i in range(50)) if shard_of(n, 2) == 0)


def _held(cluster: Cluster, node: int) -> list[dict[str, Any]]:
    status, body = call(cluster.nodes[node].url, cluster.token, "GET", "/v1/parts")
    assert status == 200, body
    return list(body["parts"])


def _ship(cluster: Cluster, node: int, part_id: str) -> None:
    status, body = call(cluster.nodes[node].url, cluster.token, "POST", f"/v1/parts/{part_id}/ship")
    assert (status, body.get("shipped")) == (200, True), body


def _durable(client: VaultClient, ns: str, ckpt_id: str) -> bool:
    return client.get(ns, ckpt_id).durable


def test_a_commit_before_shipping_is_visible_not_durable_then_adopted(cluster: Cluster) -> None:
    ns = _ns("durable/early")
    b = cluster.nodes[1]
    data = secrets.token_bytes(SIZE)
    with (
        VaultClient(cluster.proxy.url, cluster.token, progress=False) as proxy,
        VaultClient(b.url, cluster.token, progress=False) as near_b,
    ):
        first = proxy.save(ns, {"w.bin": b"whole"})  # an ordinary checkpoint: durable
        assert first.durable
        part = near_b.save_part(ns, {"x.bin": data, "y.json": b"{}"})
        ckpt = proxy.commit_parts(ns, [part], metadata={"step": 2})
        assert not ckpt.durable  # B has not shipped: the owner committed all the same
        assert proxy.get(ns, "latest").id == ckpt.id
        assert proxy.get(ns, "latest-valid", durable=True).id == first.id
        # read through the owner (from B), by range too
        assert proxy.open(ns, ckpt.id, "x.bin").read() == data
        with proxy.open(ns, ckpt.id, "x.bin") as f:
            f.seek(SIZE - 10)
            assert f.read() == data[-10:]
        assert [p["id"] for p in _held(cluster, 1)] == [part.id]  # held until adopted

        _ship(cluster, 1, part.id)
        wait_for("the owner adopting the part", lambda: _durable(proxy, ns, ckpt.id))
        wait_for("the adopted part released", lambda: not _held(cluster, 1))
        assert proxy.get(ns, "latest-valid", durable=True).id == ckpt.id
        assert proxy.open(ns, ckpt.id, "x.bin").read() == data  # from the owner now
        assert [c.id for c in proxy.list(ns)] == [ckpt.id, first.id]
        # the same commit again (an answer lost) answers the same checkpoint
        assert proxy.commit_parts(ns, [part], metadata={"step": 2}).id == ckpt.id


def test_a_checkpoint_deleted_before_adoption_releases_its_parts_once_shipped(
    cluster: Cluster,
) -> None:
    ns = _ns("durable/deleted")
    with (
        VaultClient(cluster.proxy.url, cluster.token, progress=False) as proxy,
        VaultClient(cluster.nodes[1].url, cluster.token, progress=False) as near_b,
    ):
        part = near_b.save_part(ns, {"x.bin": secrets.token_bytes(SIZE)})
        ckpt = proxy.commit_parts(ns, [part])
        assert not ckpt.durable
        proxy.delete(ns, ckpt.id)
        assert proxy.list(ns) == []
        _ship(cluster, 1, part.id)
        wait_for("the deleted checkpoint's part released", lambda: not _held(cluster, 1))
        assert proxy.list(ns) == []


def test_a_part_node_killed_before_adoption_answers_503_then_adoption_completes(
    cluster: Cluster, tmp_path: Path
) -> None:
    ns = _ns("durable/killed")
    b = cluster.nodes[1]
    data = secrets.token_bytes(SIZE)
    with VaultClient(b.url, cluster.token, progress=False) as near_b:
        part = near_b.save_part(ns, {"x.bin": data})
    once = VaultClient(
        cluster.proxy.url, cluster.token, progress=False, retry=RetryPolicy(attempts=1)
    )
    with once:
        ckpt = once.commit_parts(ns, [part])
        assert not ckpt.durable
        b.kill()
        with pytest.raises(PartUnavailable):
            once.open(ns, ckpt.id, "x.bin").read()
        with pytest.raises(PartUnavailable):
            once.load(ns, "latest", tmp_path / "out")
        assert once.get(ns, "latest").id == ckpt.id  # still visible, still not durable
        assert not once.get(ns, "latest").durable

        # B back, shipping on its own now: the claimed part ships, the owner adopts it
        assert b.config is not None
        b.config.write_text(b.config.read_text().replace(DELAY, "part_ship_delay = 0\n"))
        b.start()
        wait_for("the owner adopting the part", lambda: _durable(once, ns, ckpt.id), 60)
        wait_for("the adopted part released", lambda: not _held(cluster, 1))
        assert once.open(ns, ckpt.id, "x.bin").read() == data
        once.load(ns, "latest", tmp_path / "out2", durable=True)
        assert (tmp_path / "out2" / "x.bin").read_bytes() == data
