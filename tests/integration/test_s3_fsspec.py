"""The S3 endpoint through s3fs (fsspec's `s3://`), as Lightning, Ray and pandas reach it:
put (single and multipart), get (whole and ranged), list, delete."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import s3fs  # type: ignore[import-untyped]  # no type hints

from checkpoint_vault.client.sync import VaultClient
from tests.s3endpoint import REGION, S3Server, start


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[S3Server]:
    srv = start(tmp_path)
    try:
        yield srv
    finally:
        srv.server.stop()


def _fs(s3: S3Server) -> s3fs.S3FileSystem:
    key, secret = s3.credentials()
    return s3fs.S3FileSystem(
        key=key,
        secret=secret,
        client_kwargs={"endpoint_url": s3.endpoint, "region_name": REGION},
        skip_instance_cache=True,
    )


def test_s3fs_put_get_list_delete(s3: S3Server, tmp_path: Path) -> None:
    fs = _fs(s3)
    small = os.urandom(100_000)
    fs.pipe_file("runs/a/small.bin", small)
    big = os.urandom(11 << 20)
    with fs.open("runs/a/big.bin", "wb", block_size=5 << 20) as f:  # multipart: 3 parts
        f.write(big)
    assert fs.cat_file("runs/a/small.bin") == small
    assert fs.cat_file("runs/a/big.bin") == big
    assert (
        fs.cat_file("runs/a/big.bin", start=6 << 20, end=(6 << 20) + 1000)
        == big[6 << 20 : (6 << 20) + 1000]
    )
    with fs.open("runs/a/big.bin", "rb", block_size=1 << 20) as f:
        f.seek(10 << 20)
        assert f.read(100) == big[10 << 20 : (10 << 20) + 100]
    local = tmp_path / "up.bin"
    local.write_bytes(small[:5000])
    fs.put_file(str(local), "runs/b/up.bin")
    assert sorted(fs.ls("runs", detail=False)) == ["runs/a", "runs/b"]
    assert sorted(fs.find("runs")) == ["runs/a/big.bin", "runs/a/small.bin", "runs/b/up.bin"]
    assert fs.info("runs/a/big.bin")["size"] == len(big)
    fs.rm("runs/a", recursive=True)
    fs.invalidate_cache()
    assert fs.find("runs") == ["runs/b/up.bin"]
    fs.rm_file("runs/b/up.bin")
    fs.invalidate_cache()
    assert fs.find("runs") == []


def test_s3fs_refusals(s3: S3Server) -> None:
    key, _ = s3.credentials()
    wrong = s3fs.S3FileSystem(
        key=key,
        secret="not-the-secret",
        client_kwargs={"endpoint_url": s3.endpoint, "region_name": REGION},
        skip_instance_cache=True,
    )
    with pytest.raises(PermissionError, match="signature"):
        wrong.pipe_file("runs/x", b"x")
    token = s3.server.token
    with VaultClient(s3.server.url, token) as vault:
        scoped = vault.create_token("s3fs-scoped", ["read:mine", "write:mine"]).token
    key, secret = s3.credentials(scoped)
    fs = s3fs.S3FileSystem(
        key=key,
        secret=secret,
        client_kwargs={"endpoint_url": s3.endpoint, "region_name": REGION},
        skip_instance_cache=True,
    )
    fs.pipe_file("mine/x", b"x")
    with pytest.raises(PermissionError, match="may not write bucket 'theirs'"):
        fs.pipe_file("theirs/x", b"x")
