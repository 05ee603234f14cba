"""The S3 endpoint through boto3 against a real server: objects put (single and
multipart), read (whole and ranged), listed (prefix, delimiter, continuation), copied and
deleted; refusals with S3's error codes; `ckpt token s3` credentials that work."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3  # type: ignore[import-untyped]  # no type hints
import botocore.auth  # type: ignore[import-untyped]  # no type hints
import pytest
from boto3.s3.transfer import TransferConfig  # type: ignore[import-untyped]  # no type hints
from botocore.exceptions import ClientError  # type: ignore[import-untyped]  # no type hints

from tests.s3endpoint import S3Server, start


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[S3Server]:
    srv = start(tmp_path)
    try:
        yield srv
    finally:
        srv.server.stop()


def _code(e: pytest.ExceptionInfo[ClientError]) -> str:
    return str(e.value.response["Error"]["Code"])


def _keys(client: Any, bucket: str, **kw: Any) -> list[str]:
    return [o["Key"] for o in client.list_objects_v2(Bucket=bucket, **kw).get("Contents", [])]


@pytest.mark.slow
def test_put_get_range_list_delete(s3: S3Server) -> None:
    c = s3.boto3()
    data = os.urandom(300_000)
    put = c.put_object(Bucket="jobs", Key="run/chk-1/state.bin", Body=data)
    got = c.get_object(Bucket="jobs", Key="run/chk-1/state.bin")
    assert got["Body"].read() == data
    assert got["ETag"] == put["ETag"]
    part = c.get_object(Bucket="jobs", Key="run/chk-1/state.bin", Range="bytes=1000-69999")
    assert part["Body"].read() == data[1000:70000]
    assert part["ContentRange"] == f"bytes 1000-69999/{len(data)}"
    tail = c.get_object(Bucket="jobs", Key="run/chk-1/state.bin", Range="bytes=-10")
    assert tail["Body"].read() == data[-10:]
    head = c.head_object(Bucket="jobs", Key="run/chk-1/state.bin")
    assert head["ContentLength"] == len(data)
    c.put_object(Bucket="jobs", Key="run/chk-1/empty", Body=b"")
    assert c.get_object(Bucket="jobs", Key="run/chk-1/empty")["Body"].read() == b""
    assert _keys(c, "jobs") == ["run/chk-1/empty", "run/chk-1/state.bin"]
    c.delete_object(Bucket="jobs", Key="run/chk-1/empty")
    assert _keys(c, "jobs") == ["run/chk-1/state.bin"]
    with pytest.raises(ClientError) as e:
        c.get_object(Bucket="jobs", Key="run/chk-1/empty")
    assert _code(e) == "NoSuchKey"
    with pytest.raises(ClientError) as e:
        c.get_object(Bucket="jobs", Key="run/chk-1/state.bin", Range=f"bytes={len(data)}-")
    assert _code(e) == "InvalidRange"


def test_multipart_upload_and_abort(s3: S3Server) -> None:
    c = s3.boto3()
    data = os.urandom(13 << 20)
    config = TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20)
    c.upload_fileobj(io.BytesIO(data), "jobs", "big/model.bin", Config=config)
    assert c.get_object(Bucket="jobs", Key="big/model.bin")["Body"].read() == data
    ranged = c.get_object(Bucket="jobs", Key="big/model.bin", Range="bytes=5242000-5243999")
    assert ranged["Body"].read() == data[5242000:5244000]
    started = c.create_multipart_upload(Bucket="jobs", Key="big/never.bin")
    c.upload_part(
        Bucket="jobs", Key="big/never.bin", UploadId=started["UploadId"], PartNumber=1, Body=b"x"
    )
    c.abort_multipart_upload(Bucket="jobs", Key="big/never.bin", UploadId=started["UploadId"])
    with pytest.raises(ClientError) as e:
        c.complete_multipart_upload(
            Bucket="jobs",
            Key="big/never.bin",
            UploadId=started["UploadId"],
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"x"'}]},
        )
    assert _code(e) == "NoSuchUpload"
    assert _keys(c, "jobs") == ["big/model.bin"]


def test_listing_prefix_delimiter_and_pages(s3: S3Server) -> None:
    c = s3.boto3()
    keys = ["a/1", "a/2", "a/b/3", "b/4", "c", "d/e/f/5"]
    for key in keys:
        c.put_object(Bucket="lists", Key=key, Body=key.encode())
    top = c.list_objects_v2(Bucket="lists", Delimiter="/")
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == ["a/", "b/", "d/"]
    assert [o["Key"] for o in top["Contents"]] == ["c"]
    under = c.list_objects_v2(Bucket="lists", Prefix="a/", Delimiter="/")
    assert [o["Key"] for o in under["Contents"]] == ["a/1", "a/2"]
    assert [p["Prefix"] for p in under["CommonPrefixes"]] == ["a/b/"]
    assert _keys(c, "lists", StartAfter="b/4") == ["c", "d/e/f/5"]
    seen: list[str] = []
    pages = c.get_paginator("list_objects_v2").paginate(
        Bucket="lists", PaginationConfig={"PageSize": 2}
    )
    for page in pages:
        assert page["KeyCount"] <= 2
        seen += [o["Key"] for o in page.get("Contents", [])]
    assert seen == keys
    grouped: list[str] = []
    for page in c.get_paginator("list_objects_v2").paginate(
        Bucket="lists", Delimiter="/", PaginationConfig={"PageSize": 1}
    ):
        grouped += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        grouped += [o["Key"] for o in page.get("Contents", [])]
    assert grouped == ["a/", "b/", "c", "d/"]


def test_directory_markers(s3: S3Server) -> None:
    """Keys ending in `/` (PyArrow, Hadoop and consoles make them for directories)."""
    c = s3.boto3()
    c.put_object(Bucket="dirs", Key="exp/", Body=b"")
    c.put_object(Bucket="dirs", Key="exp/run/", Body=b"")
    c.put_object(Bucket="dirs", Key="exp/run/state.json", Body=b"{}")
    assert _keys(c, "dirs") == ["exp/", "exp/run/", "exp/run/state.json"]
    assert c.head_object(Bucket="dirs", Key="exp/")["ContentLength"] == 0
    under = c.list_objects_v2(Bucket="dirs", Prefix="exp/", Delimiter="/")
    assert [o["Key"] for o in under["Contents"]] == ["exp/"]
    assert [p["Prefix"] for p in under["CommonPrefixes"]] == ["exp/run/"]
    c.delete_object(Bucket="dirs", Key="exp/run/")
    assert _keys(c, "dirs") == ["exp/", "exp/run/state.json"]


def test_copy_and_delete_objects(s3: S3Server) -> None:
    c = s3.boto3()
    c.put_object(Bucket="jobs", Key="tmp/checkpoint.tmp123", Body=b"model_checkpoint_path")
    c.copy_object(
        Bucket="jobs",
        Key="tmp/index",
        CopySource={"Bucket": "jobs", "Key": "tmp/checkpoint.tmp123"},
    )
    c.delete_object(Bucket="jobs", Key="tmp/checkpoint.tmp123")
    assert _keys(c, "jobs") == ["tmp/index"]
    assert c.get_object(Bucket="jobs", Key="tmp/index")["Body"].read() == b"model_checkpoint_path"
    c.put_object(Bucket="jobs", Key="x/1", Body=b"1")
    c.put_object(Bucket="jobs", Key="x/2", Body=b"2")
    answer = c.delete_objects(
        Bucket="jobs", Delete={"Objects": [{"Key": "x/1"}, {"Key": "x/2"}, {"Key": "x/none"}]}
    )
    assert sorted(d["Key"] for d in answer["Deleted"]) == ["x/1", "x/2", "x/none"]
    assert _keys(c, "jobs") == ["tmp/index"]


def test_refusals_carry_s3_codes(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    c = s3.boto3()
    c.put_object(Bucket="mine", Key="k", Body=b"v")
    key, _ = s3.credentials()
    wrong = boto3.client(
        "s3",
        endpoint_url=s3.endpoint,
        aws_access_key_id=key,
        aws_secret_access_key="not-the-secret",
        region_name="us-east-1",
    )
    with pytest.raises(ClientError) as e:
        wrong.get_object(Bucket="mine", Key="k")
    assert _code(e) == "SignatureDoesNotMatch"
    unknown = boto3.client(
        "s3",
        endpoint_url=s3.endpoint,
        aws_access_key_id="CKPT0000000000000000",
        aws_secret_access_key="x",
        region_name="us-east-1",
    )
    with pytest.raises(ClientError) as e:
        unknown.list_objects_v2(Bucket="mine")
    assert _code(e) == "InvalidAccessKeyId"

    token = _token(s3, "scoped", ["read:mine", "write:mine"])
    scoped = s3.boto3(token)
    assert scoped.get_object(Bucket="mine", Key="k")["Body"].read() == b"v"
    with pytest.raises(ClientError) as e:
        scoped.put_object(Bucket="theirs", Key="k", Body=b"v")
    assert _code(e) == "AccessDenied"
    with pytest.raises(ClientError) as e:
        scoped.list_objects_v2(Bucket="theirs")
    assert _code(e) == "AccessDenied"
    with pytest.raises(ClientError) as e:
        scoped.delete_object(Bucket="mine", Key="k")  # write is append-only: no delete scope
    assert _code(e) == "AccessDenied"

    past = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) - dt.timedelta(hours=1)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: past)
    with pytest.raises(ClientError) as e:
        s3.boto3().get_object(Bucket="mine", Key="k")
    assert _code(e) == "RequestTimeTooSkewed"


def test_presigned_urls(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    c = s3.boto3(signature_version="s3v4")  # boto3 presigns with Version 2 otherwise
    c.put_object(Bucket="shared", Key="model.bin", Body=b"weights")
    v2 = s3.boto3().generate_presigned_url(
        "get_object", Params={"Bucket": "shared", "Key": "model.bin"}, ExpiresIn=60
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(v2, timeout=10)
    assert b"Version 4" in refused.value.read()
    url = c.generate_presigned_url(
        "get_object", Params={"Bucket": "shared", "Key": "model.bin"}, ExpiresIn=60
    )
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.read() == b"weights"
    past = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) - dt.timedelta(hours=2)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: past)
    stale = c.generate_presigned_url(
        "get_object", Params={"Bucket": "shared", "Key": "model.bin"}, ExpiresIn=60
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(stale, timeout=10)
    assert e.value.code == 403
    assert b"<Code>AccessDenied</Code>" in e.value.read()


def _token(s3: S3Server, name: str, scopes: list[str]) -> str:
    out = _ckpt(s3, "token", "create", name, *[f"--scope={s}" for s in scopes])
    return out.strip()


def _ckpt(s3: S3Server, *args: str, token: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPT_")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "checkpoint_vault.cli",
            "--url",
            s3.server.url,
            "--token",
            token or s3.server.token,
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_ckpt_prints_credentials_that_sign(s3: S3Server) -> None:
    token = _token(s3, "producer", ["read:flink-*", "write:flink-*"])
    creds = json.loads(_ckpt(s3, "token", "s3", "--json", token=token))
    assert creds["access_key_id"].startswith("CKPT")
    assert token not in json.dumps(creds)
    shell = _ckpt(s3, "token", "s3", token=token).splitlines()
    assert shell == [
        f"AWS_ACCESS_KEY_ID={creds['access_key_id']}",
        f"AWS_SECRET_ACCESS_KEY={creds['secret_access_key']}",
    ]
    c = boto3.client(
        "s3",
        endpoint_url=s3.endpoint,
        aws_access_key_id=creds["access_key_id"],
        aws_secret_access_key=creds["secret_access_key"],
        region_name="us-east-1",
    )
    c.put_object(Bucket="flink-a", Key="k", Body=b"via ckpt token s3")
    assert c.get_object(Bucket="flink-a", Key="k")["Body"].read() == b"via ckpt token s3"
    revoked = subprocess.run(
        [
            sys.executable,
            "-m",
            "checkpoint_vault.cli",
            "--url",
            s3.server.url,
            "--token",
            "ckpt_00_11",
            "token",
            "s3",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert revoked.returncode != 0
