"""The S3 endpoint through obstore (Rust's object_store, as TensorStore-like and Arrow
readers use): put (single and multipart), get (whole and ranged), list, delete."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import obstore
import pytest
from obstore.store import S3Store

from tests.s3endpoint import REGION, S3Server, start


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[S3Server]:
    srv = start(tmp_path)
    try:
        yield srv
    finally:
        srv.server.stop()


def _store(s3: S3Server, bucket: str) -> S3Store:
    key, secret = s3.credentials()
    return S3Store(
        bucket,
        endpoint=s3.endpoint,
        access_key_id=key,
        secret_access_key=secret,
        region=REGION,
        virtual_hosted_style_request=False,
        client_options={"allow_http": True},
    )


def test_obstore_put_get_list_delete(s3: S3Server) -> None:
    store = _store(s3, "orbax")
    small = os.urandom(70_000)
    obstore.put(store, "ckpt/1/array.zarr/0.0", small)
    big = os.urandom(12 << 20)
    obstore.put(store, "ckpt/1/big", big, use_multipart=True, chunk_size=5 << 20)
    assert obstore.get(store, "ckpt/1/array.zarr/0.0").bytes() == small
    assert obstore.get(store, "ckpt/1/big").bytes() == big
    assert (
        bytes(obstore.get_range(store, "ckpt/1/big", start=7 << 20, length=4096))
        == big[7 << 20 : (7 << 20) + 4096]
    )
    meta = obstore.head(store, "ckpt/1/big")
    assert meta["size"] == len(big)
    listed = sorted(m["path"] for batch in obstore.list(store, prefix="ckpt") for m in batch)
    assert listed == ["ckpt/1/array.zarr/0.0", "ckpt/1/big"]
    grouped = obstore.list_with_delimiter(store, prefix="ckpt/1")
    assert grouped["common_prefixes"] == ["ckpt/1/array.zarr"]
    assert [m["path"] for m in grouped["objects"]] == ["ckpt/1/big"]
    obstore.delete(store, ["ckpt/1/big", "ckpt/1/array.zarr/0.0"])
    assert [m for batch in obstore.list(store, prefix="ckpt") for m in batch] == []
    with pytest.raises(FileNotFoundError):
        obstore.get(store, "ckpt/1/big").bytes()


def test_obstore_refusals(s3: S3Server) -> None:
    key, _ = s3.credentials()
    wrong = S3Store(
        "orbax",
        endpoint=s3.endpoint,
        access_key_id=key,
        secret_access_key="not-the-secret",
        region=REGION,
        virtual_hosted_style_request=False,
        client_options={"allow_http": True},
        retry_config={"max_retries": 0, "backoff": {}, "retry_timeout": timedelta(seconds=5)},
    )
    with pytest.raises(Exception, match="SignatureDoesNotMatch"):  # noqa: PT011 - obstore's
        obstore.put(wrong, "k", b"v")
