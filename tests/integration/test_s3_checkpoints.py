"""Objects become checkpoints: what lands through the S3 endpoint accumulates in an open
upload and is committed as one checkpoint, with lineage, when a completion marker lands
or the bucket sits idle; reads see the open objects; a framework deleting an old
checkpoint directory deletes that checkpoint, never a pinned one."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError  # type: ignore[import-untyped]  # no type hints

from checkpoint_vault.client.sync import VaultClient
from tests.s3endpoint import S3Server, start

POLL_SECONDS = 20.0


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[S3Server]:
    srv = start(tmp_path, commit_after="1s")
    try:
        yield srv
    finally:
        srv.server.stop()


def _vault(s3: S3Server) -> VaultClient:
    return VaultClient(s3.server.url, s3.server.token)


def _live(v: VaultClient, ns: str) -> list[Any]:
    """The namespace's live checkpoints, oldest first."""
    return list(reversed(v.list(ns)))


def _flink_checkpoint(c: Any, n: int) -> None:
    """What Flink's checkpoint coordinator writes for checkpoint n: state files, then the
    `_metadata` that completes it."""
    c.put_object(Bucket="flink", Key=f"job/chk-{n}/op-state", Body=f"state {n}".encode() * 500)
    c.put_object(Bucket="flink", Key=f"job/chk-{n}/_metadata", Body=f"meta {n}".encode())


def test_marker_commits_one_checkpoint_with_lineage(s3: S3Server) -> None:
    c = s3.boto3()
    with _vault(s3) as v:
        c.put_object(Bucket="flink", Key="job/chk-1/op-state", Body=b"s1")
        assert c.get_object(Bucket="flink", Key="job/chk-1/op-state")["Body"].read() == b"s1"
        with pytest.raises(Exception):  # noqa: B017, PT011 - nothing committed yet
            v.get("flink")
        c.put_object(Bucket="flink", Key="job/chk-1/_metadata", Body=b"m1")
        for n in range(2, 6):
            _flink_checkpoint(c, n)
        live = _live(v, "flink")
        assert len(live) == 5
        assert [ck.parent for ck in live[1:]] == [ck.id for ck in live[:-1]]
        newest = live[-1]
        assert "job/chk-5/_metadata" in newest.files
        assert "job/chk-1/op-state" in newest.files  # the bucket as it stood
        assert v.get("flink").id == newest.id
        assert len(v.lineage("flink")) == 5


def test_deleting_a_checkpoint_directory_deletes_that_checkpoint(s3: S3Server) -> None:
    c = s3.boto3()
    with _vault(s3) as v:
        for n in (1, 2, 3):
            _flink_checkpoint(c, n)
        first, second, third = _live(v, "flink")
        for key in ("job/chk-1/op-state", "job/chk-1/_metadata"):  # Flink discarding chk-1
            c.delete_object(Bucket="flink", Key=key)
        assert [ck.id for ck in _live(v, "flink")] == [second.id, third.id]
        keys = [o["Key"] for o in c.list_objects_v2(Bucket="flink")["Contents"]]
        assert not any(k.startswith("job/chk-1/") for k in keys)
        v.pin("flink", second.id)
        with pytest.raises(ClientError) as e:
            c.delete_object(Bucket="flink", Key="job/chk-2/_metadata")
        assert e.value.response["Error"]["Code"] == "AccessDenied"
        assert second.id in e.value.response["Error"]["Message"]
        assert "pinned" in e.value.response["Error"]["Message"]
        assert c.get_object(Bucket="flink", Key="job/chk-2/_metadata")["Body"].read() == b"meta 2"
        answer = c.delete_objects(
            Bucket="flink",
            Delete={"Objects": [{"Key": "job/chk-2/op-state"}, {"Key": "job/none"}]},
        )
        assert [d["Key"] for d in answer["Deleted"]] == ["job/none"]
        (refused,) = answer["Errors"]
        assert (refused["Key"], refused["Code"]) == ("job/chk-2/op-state", "AccessDenied")
        assert second.id in refused["Message"]
        _flink_checkpoint(c, 4)
        fourth = _live(v, "flink")[-1]
        assert "job/chk-1/_metadata" not in fourth.files  # the deletion is in the next one
        assert fourth.parent == third.id


@pytest.mark.slow
def test_idle_rule_and_policy_markers(s3: S3Server) -> None:
    c = s3.boto3()
    with _vault(s3) as v:
        c.put_object(Bucket="lightning", Key="run/epoch=0-step=10.ckpt", Body=b"w" * 1000)
        first = _wait_for(lambda: _live(v, "lightning"), 1)  # no marker: committed when idle
        assert list(first[0].files) == ["run/epoch=0-step=10.ckpt"]
        v.set_policy("lightning", {"s3": {"markers": ["*.ckpt"], "commit_after": "1h"}})
        c.put_object(Bucket="lightning", Key="run/epoch=1-step=20.ckpt", Body=b"x" * 1000)
        both = _live(v, "lightning")  # the marker committed it at once
        assert len(both) == 2
        assert both[1].parent == both[0].id


@pytest.mark.slow
def test_restart_keeps_the_open_checkpoint(s3: S3Server) -> None:
    c = s3.boto3()
    c.put_object(Bucket="tfjob", Key="ckpts/ckpt-1.data-00000-of-00001", Body=b"d" * 4096)
    c.put_object(Bucket="tfjob", Key="ckpts/ckpt-1.index", Body=b"i" * 64)
    s3.server.restart()
    c = s3.boto3()
    assert c.get_object(Bucket="tfjob", Key="ckpts/ckpt-1.index")["Body"].read() == b"i" * 64
    c.put_object(Bucket="tfjob", Key="ckpts/checkpoint", Body=b'model_checkpoint_path: "ckpt-1"')
    with _vault(s3) as v:
        (only,) = _live(v, "tfjob")
        assert sorted(only.files) == [
            "ckpts/checkpoint",
            "ckpts/ckpt-1.data-00000-of-00001",
            "ckpts/ckpt-1.index",
        ]


def _wait_for(probe: Any, n: int) -> Any:
    deadline = time.monotonic() + POLL_SECONDS
    while True:
        got = probe()
        if len(got) >= n:
            return got
        assert time.monotonic() < deadline, f"{n} checkpoints did not appear"
        time.sleep(0.1)  # pacing a bounded poll of a condition


def test_a_marker_put_again_with_nothing_changed_commits_nothing(s3: S3Server) -> None:
    """A retried marker PUT (its answer lost, or a proxy cutting the session) is the same
    checkpoint, not a second one that would push a real checkpoint out of `keep_last`."""
    c = s3.boto3()
    with _vault(s3) as v:
        _flink_checkpoint(c, 1)
        (first,) = _live(v, "flink")
        c.put_object(Bucket="flink", Key="job/chk-1/_metadata", Body=b"meta 1")  # the retry
        assert [ck.id for ck in _live(v, "flink")] == [first.id]
        c.put_object(Bucket="flink", Key="job/chk-1/_metadata", Body=b"meta 1, again")
        live = _live(v, "flink")
        assert len(live) == 2
        assert live[1].parent == first.id
        assert c.get_object(Bucket="flink", Key="job/chk-1/_metadata")["Body"].read() == (
            b"meta 1, again"
        )
