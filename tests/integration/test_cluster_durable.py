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

import contextlib
import json
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3  # type: ignore[import-untyped]  # no type hints
import pytest
import torch
import torch.distributed.checkpoint as dcp
from botocore.config import Config  # type: ignore[import-untyped]  # no type hints
from botocore.exceptions import ClientError  # type: ignore[import-untyped]  # no type hints
from yarl import URL

from checkpoint_vault.api.s3.sigv4 import sign
from checkpoint_vault.cli import main
from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.dcp import VaultReader, VaultWriter
from checkpoint_vault.client.errors import PartUnavailable
from checkpoint_vault.client.transport import RetryPolicy
from checkpoint_vault.cluster.shards import shard_of
from checkpoint_vault.protocol import s3_credentials

from ..cluster import Cluster, call, wait_for
from ..seaweed import SeaweedFS

# dcp.save in this process warns that torch.distributed is not initialized: it is not.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings(
        "ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning"
    ),
]

DELAY = "part_ship_delay = 3600\n"
EXTRA = "[gc]\ngrace = 0\n[uploads]\n" + DELAY  # shipped when the test asks
SIZE = 1 << 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, seaweed: SeaweedFS) -> Iterator[Cluster]:
    c = Cluster(
        tmp_path_factory.mktemp("durable"), seaweed, secrets.token_hex(4), shards=2,
        shared=True, extra=EXTRA, s3=True,
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


@contextlib.contextmanager
def _s3(cluster: Cluster, node: int) -> Iterator[Any]:
    """boto3 on a node's S3 endpoint, not retrying (a 503 is an answer the test expects)."""
    key, secret = s3_credentials(cluster.token)
    client = boto3.client(
        "s3", endpoint_url=cluster.s3_url(node), aws_access_key_id=key,
        aws_secret_access_key=secret, region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}),
    )  # fmt: skip
    try:
        yield client
    finally:
        client.close()


def test_s3_reads_a_checkpoint_not_durable_from_its_part_node(cluster: Cluster) -> None:
    """GetObject (whole, ranged) and HeadObject of a bucket whose newest checkpoint is a
    commit of parts not adopted yet: served by the owner's endpoint from the part's node.
    Before, GetObject failed (the owner holds none of those chunks)."""
    ns = _ns("s3durable")  # a bucket name: no '/'
    data = secrets.token_bytes(SIZE)
    with (
        VaultClient(cluster.proxy.url, cluster.token, progress=False) as proxy,
        VaultClient(cluster.nodes[1].url, cluster.token, progress=False) as near_b,
        _s3(cluster, 0) as s3,  # A owns the namespace: its endpoint serves the bucket
    ):
        part = near_b.save_part(ns, {"chk-1/x.bin": data, "chk-1/_metadata": b"{}"})
        ckpt = proxy.commit_parts(ns, [part])
        assert not ckpt.durable
        got = s3.get_object(Bucket=ns, Key="chk-1/x.bin")
        assert got["Body"].read() == data
        assert got["ContentLength"] == SIZE
        ranged = s3.get_object(Bucket=ns, Key="chk-1/x.bin", Range="bytes=1000-69999")
        assert ranged["Body"].read() == data[1000:70000]
        assert ranged["ContentRange"] == f"bytes 1000-69999/{SIZE}"
        tail = s3.get_object(Bucket=ns, Key="chk-1/x.bin", Range="bytes=-10")
        assert tail["Body"].read() == data[-10:]
        head = s3.head_object(Bucket=ns, Key="chk-1/x.bin")
        assert (head["ContentLength"], head["ETag"]) == (SIZE, got["ETag"])
        assert s3.get_object(Bucket=ns, Key="chk-1/_metadata")["Body"].read() == b"{}"
        assert not proxy.get(ns, ckpt.id).durable  # all of it read from B, none adopted
        # the owner asked B signed with the caller's S3 key: accepted there on a part's
        # files only, the rest of B's JSON API stays Bearer-only
        key, secret = s3_credentials(cluster.token)
        url = URL(cluster.nodes[1].url + "/v1/namespaces")
        signed = sign(secret, key, "GET", url.raw_authority, url.raw_path, "", time.time())
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(str(url), headers=signed), timeout=10)
        assert refused.value.code == 401
        refused.value.close()
        _ship(cluster, 1, part.id)
        wait_for("the owner adopting the part", lambda: _durable(proxy, ns, ckpt.id))
        again = s3.get_object(Bucket=ns, Key="chk-1/x.bin", Range="bytes=1000-69999")
        assert again["Body"].read() == data[1000:70000]  # from the owner now


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


def test_a_dcp_save_across_hosts_waiting_for_durability_is_durable_when_it_returns(
    cluster: Cluster,
) -> None:
    """`VaultWriter(..., wait_durable=True)`: the rank's part is on B, which ships only
    when asked (an hour's delay here), so the commit must have waited for B's shipping.
    Before, the writer had no such option (typed; without `nearby` it raised)."""
    state = {"w": torch.arange(4096, dtype=torch.float32), "step": 7}
    with (
        VaultClient(cluster.proxy.url, cluster.token, progress=False) as proxy,
        VaultClient(cluster.nodes[1].url, cluster.token, progress=False) as near_b,
    ):
        ns = _ns("dcp/wait")
        writer = VaultWriter(proxy, ns, nearby=near_b, wait_durable=True)
        dcp.save(state, storage_writer=writer)
        assert writer.checkpoint is not None
        assert writer.checkpoint.durable
        assert proxy.get(ns, "latest", durable=True).id == writer.checkpoint.id
        one = VaultWriter(proxy, _ns("dcp/one"), wait_durable=True)  # one node: durable anyway
        dcp.save(state, storage_writer=one)
        assert one.checkpoint is not None
        assert one.checkpoint.durable
        loaded = {"w": torch.zeros(4096), "step": 0}
        dcp.load(loaded, storage_reader=VaultReader(proxy, ns, "latest", durable=True))
        assert torch.equal(loaded["w"], state["w"])
        assert loaded["step"] == 7


def _ckpt(cluster: Cluster, capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    """`ckpt --json` through the proxy, in this process; its answer."""
    assert main(["--url", cluster.proxy.url, "--token", cluster.token, *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_ckpt_ls_show_pull_durable_skip_a_checkpoint_not_adopted_yet(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`--durable` on `ls`, `show` and `pull`, and the `durable` column; before, the CLI had
    neither (usage error 2 on the flag)."""
    ns = _ns("durable/cli")
    with (
        VaultClient(cluster.proxy.url, cluster.token, progress=False) as proxy,
        VaultClient(cluster.nodes[1].url, cluster.token, progress=False) as near_b,
    ):
        first = proxy.save(ns, {"x.bin": b"first"})
        part = near_b.save_part(ns, {"x.bin": b"second"})
        ckpt = proxy.commit_parts(ns, [part])
        assert not ckpt.durable
        listed = _ckpt(cluster, capsys, "ls", ns)
        assert [(r["id"], r["durable"]) for r in listed] == [(ckpt.id, False), (first.id, True)]
        assert [r["id"] for r in _ckpt(cluster, capsys, "ls", ns, "--durable")] == [first.id]
        assert _ckpt(cluster, capsys, "show", ns, "latest")["id"] == ckpt.id
        assert _ckpt(cluster, capsys, "show", ns, "latest", "--durable")["id"] == first.id
        pulled = _ckpt(cluster, capsys, "pull", ns, "latest", str(tmp_path / "d"), "--durable")
        assert pulled["id"] == first.id
        assert (tmp_path / "d" / "x.bin").read_bytes() == b"first"
        base = ["--url", cluster.proxy.url, "--token", cluster.token]
        assert main([*base, "ls", ns]) == 0  # for people: the column says which is not yet
        header, _, *rows = capsys.readouterr().out.splitlines()
        at = header.index("durable")  # the column's cells start where its name does
        assert [(r.split()[0], r[at:].split()[0]) for r in rows] == [
            (ckpt.id, "no"),
            (first.id, "yes"),
        ]
        _ship(cluster, 1, part.id)
        wait_for("the owner adopting the part", lambda: _durable(proxy, ns, ckpt.id))
        durable = _ckpt(cluster, capsys, "ls", ns, "--durable")
        assert [r["id"] for r in durable] == [ckpt.id, first.id]


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


def test_an_owner_restarted_before_adoption_still_releases_the_remote_parts(
    cluster: Cluster,
) -> None:
    """The owner keeps the committing token in memory only; killed and restarted between
    the commit and the adoption, it has none, and marks the part released in the store,
    which B takes. Before, B held the part until its claim ended (7 days)."""
    ns = _ns("durable/restarted")
    a = cluster.nodes[0]
    data = secrets.token_bytes(SIZE)
    with VaultClient(cluster.nodes[1].url, cluster.token, progress=False) as near_b:
        part = near_b.save_part(ns, {"x.bin": data})
    with VaultClient(cluster.proxy.url, cluster.token, progress=False) as proxy:
        ckpt = proxy.commit_parts(ns, [part])
        assert not ckpt.durable
        assert a.kill() == -9
        a.start()
        wait_for(
            "every node seeing both shards owned",
            lambda: all(all(o["owner"] for o in cluster.state(i)["shard_owners"]) for i in (0, 1)),
        )
        assert [p["id"] for p in _held(cluster, 1)] == [part.id]
        _ship(cluster, 1, part.id)
        wait_for("the restarted owner adopting the part", lambda: _durable(proxy, ns, ckpt.id))
        wait_for("the adopted part released by its marker", lambda: not _held(cluster, 1))
        assert proxy.open(ns, ckpt.id, "x.bin").read() == data


def test_a_part_node_killed_before_adoption_answers_503_then_adoption_completes(
    cluster: Cluster, tmp_path: Path
) -> None:
    ns, s3_ns = _ns("durable/killed"), _ns("s3killed")
    b = cluster.nodes[1]
    data = secrets.token_bytes(SIZE)
    with VaultClient(b.url, cluster.token, progress=False) as near_b:
        part = near_b.save_part(ns, {"x.bin": data})
        s3_part = near_b.save_part(s3_ns, {"x.bin": data})
    once = VaultClient(
        cluster.proxy.url, cluster.token, progress=False, retry=RetryPolicy(attempts=1)
    )
    with once:
        ckpt = once.commit_parts(ns, [part])
        s3_ckpt = once.commit_parts(s3_ns, [s3_part])
        assert not ckpt.durable
        assert not s3_ckpt.durable
        b.kill()
        with pytest.raises(PartUnavailable):
            once.open(ns, ckpt.id, "x.bin").read()
        with pytest.raises(PartUnavailable):
            once.load(ns, "latest", tmp_path / "out")
        with _s3(cluster, 0) as s3, pytest.raises(ClientError) as refused:  # the same, S3
            s3.get_object(Bucket=s3_ns, Key="x.bin")
        answer = refused.value.response
        assert answer["Error"]["Code"] == "ServiceUnavailable", answer
        assert answer["ResponseMetadata"]["HTTPHeaders"].get("retry-after") == "1", answer
        assert once.get(ns, "latest").id == ckpt.id  # still visible, still not durable
        assert not once.get(ns, "latest").durable

        # B back, shipping on its own now: the claimed part ships, the owner adopts it
        assert b.config is not None
        b.config.write_text(b.config.read_text().replace(DELAY, "part_ship_delay = 0\n"))
        b.start()
        wait_for("the owner adopting the part", lambda: _durable(once, ns, ckpt.id), 60)
        wait_for("the adopted part released", lambda: not _held(cluster, 1))
        assert once.open(ns, ckpt.id, "x.bin").read() == data
        assert _durable(once, s3_ns, s3_ckpt.id)
        with _s3(cluster, 0) as s3:
            assert s3.get_object(Bucket=s3_ns, Key="x.bin")["Body"].read() == data
        once.load(ns, "latest", tmp_path / "out2", durable=True)
        assert (tmp_path / "out2" / "x.bin").read_bytes() == data
