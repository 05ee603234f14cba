"""The S3 endpoint of a cluster through HAProxy (the product's "Flink, Spark, Ray, Orbax
unchanged"): two shards, each a primary and a standby on another node, all running the
S3 endpoint, HAProxy's S3 frontend from `ckpt cluster proxy-config`. boto3, pointed at
the proxy only, writes buckets on both shards (PutObject, a multipart upload), commits
each with its marker, reads back and lists every bucket; a node's endpoint serves a bucket
of the other shard (forwarded, the signature checked on the owner). Then the owner of one
bucket's shard is SIGKILLed: until its standby takes over, the shard's buckets answer
503 ServiceUnavailable with Retry-After; boto3's retries ride them, the committed
checkpoint reads back through the proxy, the objects written before the kill are in the
new owner's open upload, and new writes commit.

Before this change the proxy had no S3 frontend at all (`proxy-config` knew no
`--s3-bind`), and a node's endpoint served any bucket from its own shard."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3  # type: ignore[import-untyped]  # no type hints
import pytest
from botocore.config import Config  # type: ignore[import-untyped]  # no type hints
from botocore.exceptions import ClientError  # type: ignore[import-untyped]  # no type hints

from checkpoint_vault.client import VaultClient
from checkpoint_vault.cluster.shards import shard_of
from checkpoint_vault.protocol import s3_credentials

from ..cluster import Cluster, call, wait_for
from ..seaweed import SeaweedFS

pytestmark = pytest.mark.slow  # a cluster of four processes and a takeover: ~20 s

SHARDS = 2
PART = 5 << 20  # S3's smallest part but the last


@pytest.fixture
def cluster(tmp_path: Path, seaweed: SeaweedFS) -> Iterator[Cluster]:
    c = Cluster(tmp_path, seaweed, secrets.token_hex(4), shards=SHARDS, standbys=True, s3=True)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def _checked(cluster: Cluster) -> bool:
    """Whether HAProxy's first checks found every standby's S3 server down. Until then it
    counts them up, and a request it sent to one (forwarded from there) is cut when the
    check marks it down (`on-marked-down shutdown-sessions`): boto3 would send it again,
    and a marker sent twice commits twice."""
    log = (cluster.proxy.root / "haproxy.log").read_text(errors="replace")
    return all(
        f"Server s3shard{k}/{proc.data_dir.name} is DOWN" in log
        for k, proc in enumerate(cluster.standbys)
    )


def _bucket(prefix: str, shard: int) -> str:
    return next(b for b in (f"{prefix}-{i}" for i in range(50)) if shard_of(b, SHARDS) == shard)


def _s3(cluster: Cluster, url: str, attempts: int = 10) -> Any:
    """boto3 as a job would configure it: path style, standard retries (503s retried)."""
    key, secret = s3_credentials(cluster.token)
    return boto3.client(
        "s3", endpoint_url=url, aws_access_key_id=key, aws_secret_access_key=secret,
        region_name="us-east-1",
        config=Config(
            s3={"addressing_style": "path"}, retries={"mode": "standard", "max_attempts": attempts}
        ),
    )  # fmt: skip


def _read(s3: Any, bucket: str, key: str) -> bytes:
    return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def _checkpoint(s3: Any, bucket: str, step: int, data: bytes, multipart: bool) -> None:
    """One checkpoint of a job: its state, then its marker (the commit)."""
    key = f"chk-{step}/state.bin"
    if multipart:
        up = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        parts = []
        for n, at in enumerate(range(0, len(data), PART), start=1):
            etag = s3.upload_part(
                Bucket=bucket, Key=key, UploadId=up, PartNumber=n, Body=data[at : at + PART]
            )["ETag"]
            parts.append({"PartNumber": n, "ETag": etag})
        s3.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=up, MultipartUpload={"Parts": parts}
        )
    else:
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    s3.put_object(Bucket=bucket, Key=f"chk-{step}/_metadata", Body=b'{"step": %d}' % step)


def test_s3_through_the_proxy_follows_each_bucket_to_its_shard(cluster: Cluster) -> None:
    started = time.monotonic()
    wait_for("the proxy's checks of the standbys", lambda: _checked(cluster), timeout=10)
    b0, b1 = _bucket("flink-job", 0), _bucket("spark-job", 1)
    small, big = secrets.token_bytes(300_000), secrets.token_bytes(PART + 123_456)
    s3 = _s3(cluster, cluster.proxy.s3_url)
    _checkpoint(s3, b0, 1, small, multipart=False)
    _checkpoint(s3, b1, 1, big, multipart=True)
    assert _read(s3, b0, "chk-1/state.bin") == small
    assert _read(s3, b1, "chk-1/state.bin") == big
    listed = {b["Name"] for b in s3.list_buckets()["Buckets"]}
    assert {b0, b1} <= listed  # each from its own shard's owner
    with VaultClient(cluster.proxy.url, cluster.token, progress=False) as client:
        for bucket in (b0, b1):  # each marker committed one checkpoint, on its shard
            assert len(client.list(bucket)) == 1
    for k, node in enumerate(cluster.nodes):  # each node's own data dir: its shard's only
        own = {"X-Ckpt-Forwarded": "test"}  # one process's own namespaces, not the whole
        status, body = call(node.url, cluster.token, "GET", "/v1/namespaces", headers=own)
        assert status == 200, body
        assert {n["name"] for n in body["namespaces"]} & {b0, b1} == {[b0, b1][k]}
    # a node's endpoint serves the other shard's bucket: forwarded to its owner with the
    # caller's Host, so the signature made for node 1 holds there
    direct = _s3(cluster, cluster.s3_url(1))
    assert _read(direct, b0, "chk-1/state.bin") == small
    assert direct.head_object(Bucket=b0, Key="chk-1/state.bin")["ContentLength"] == len(small)
    passed = secrets.token_bytes(150_000)  # a body streamed through the hop
    direct.put_object(Bucket=b0, Key="chk-2/passed.bin", Body=passed)
    assert {b0, b1} <= {b["Name"] for b in direct.list_buckets()["Buckets"]}
    assert cluster.state(1)["forwarded"] >= 1

    early = secrets.token_bytes(100_000)  # acknowledged, its checkpoint not committed yet
    s3.put_object(Bucket=b0, Key="chk-2/early.bin", Body=early)
    cluster.nodes[0].kill()  # shard 0's owner: its standby (on node n1) takes over
    killed = time.monotonic()
    once = _s3(cluster, cluster.s3_url(1), attempts=1)
    with pytest.raises(ClientError) as gap:  # seconds before any takeover: no owner
        once.get_object(Bucket=b0, Key="chk-1/state.bin")
    answer = gap.value.response
    assert answer["Error"]["Code"] == "ServiceUnavailable"
    assert answer["ResponseMetadata"]["HTTPHeaders"]["retry-after"] == "2"
    assert _read(s3, b0, "chk-1/state.bin") == small  # boto3 retries the 503s meanwhile
    back = time.monotonic() - killed
    # the new owner found the bucket's open upload in its replica: the object written
    # before the SIGKILL is there, and goes into the next checkpoint
    assert _read(s3, b0, "chk-2/early.bin") == early
    assert _read(s3, b0, "chk-2/passed.bin") == passed
    after = secrets.token_bytes(200_000)
    _checkpoint(s3, b0, 2, after, multipart=False)
    assert _read(s3, b0, "chk-2/state.bin") == after
    assert _read(s3, b0, "chk-1/state.bin") == small
    _checkpoint(s3, b1, 2, after, multipart=False)  # the other shard never stopped
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=b0)["Contents"]}
    assert {"chk-1/state.bin", "chk-2/state.bin", "chk-2/_metadata"} <= keys
    assert {b0, b1} <= {b["Name"] for b in s3.list_buckets()["Buckets"]}
    wait_for(  # the standby of shard 0 owns it now, and committed the new checkpoint
        "shard 0 owned by the standby",
        lambda: cluster.state(1)["shard_owners"][0]["url"] == cluster.standbys[0].url,
    )
    with VaultClient(cluster.proxy.url, cluster.token, progress=False) as client:
        newest, _ = client.list(b0)
        assert client.read_range(b0, newest.id, "chk-2/early.bin", 0, len(early)) == early
    print(f"read back {back:.2f} s after the SIGKILL; test {time.monotonic() - started:.1f} s")
