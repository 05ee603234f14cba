"""The endpoint's SigV4 checks against signatures made by botocore (the AWS SDK's own
signer) and against the streaming-upload example of the S3 API reference."""

from __future__ import annotations

import datetime as dt
import hashlib

import pytest
from botocore.auth import S3SigV4Auth  # type: ignore[import-untyped]  # no type hints
from botocore.awsrequest import AWSRequest  # type: ignore[import-untyped]
from botocore.credentials import Credentials  # type: ignore[import-untyped]

from checkpoint_vault.api.s3.errors import S3Error
from checkpoint_vault.api.s3.sigv4 import (
    Signed,
    check_time,
    chunk_signature,
    parse_header,
    request_time,
    signing_key,
    verify,
)

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # the reference's example key


def _signed_by_botocore(method: str, url: str, body: bytes, headers: dict[str, str]) -> AWSRequest:
    request = AWSRequest(method=method, url=url, data=body, headers=headers)
    request.context["payload_signing_enabled"] = True
    S3SigV4Auth(Credentials("CKPTabc", SECRET), "s3", "us-east-1").add_auth(request)
    return request


def _check(request: AWSRequest, secret: str = SECRET) -> Signed:
    netloc, _, rest = request.url.split("://", 1)[1].partition("/")
    headers = {"host": netloc, **{k.lower(): v for k, v in request.headers.items()}}
    signed = parse_header(headers["authorization"], headers)
    path, _, query = rest.partition("?")
    verify(secret, signed, request.method, "/" + path, query, headers)
    return signed


@pytest.mark.parametrize(
    ("method", "url", "body"),
    [
        ("GET", "http://127.0.0.1:9000/bucket/a/b%20c/d.bin", b""),
        ("PUT", "http://127.0.0.1:9000/bucket/k%2Bplus/%E2%9C%93", b"payload"),
        (
            "GET",
            "http://127.0.0.1:9000/bucket?list-type=2&prefix=a%2Fb&delimiter=%2F&max-keys=2",
            b"",
        ),
        ("POST", "http://127.0.0.1:9000/bucket/key?uploads", b""),
        ("PUT", "http://127.0.0.1:9000/bucket/key?partNumber=3&uploadId=a-b_c", b"x" * 100),
    ],
)
def test_botocore_signatures_verify(method: str, url: str, body: bytes) -> None:
    request = _signed_by_botocore(method, url, body, {"Range": "bytes=0-9"})
    signed = _check(request)
    assert signed.access_key == "CKPTabc"
    assert signed.payload == hashlib.sha256(body).hexdigest()
    with pytest.raises(S3Error) as e:
        _check(request, "another secret")
    assert e.value.code == "SignatureDoesNotMatch"


def test_a_changed_request_does_not_verify() -> None:
    request = _signed_by_botocore("GET", "http://127.0.0.1:9000/bucket/key", b"", {})
    request.url = "http://127.0.0.1:9000/bucket/other"
    with pytest.raises(S3Error) as e:
        _check(request)
    assert e.value.code == "SignatureDoesNotMatch"


def test_clock_skew_is_bounded() -> None:
    request = _signed_by_botocore("GET", "http://127.0.0.1:9000/bucket/key", b"", {})
    signed = _check(request)
    at = request_time(signed.amz_date)
    check_time(signed, at + 14 * 60)
    with pytest.raises(S3Error) as e:
        check_time(signed, at + 16 * 60)
    assert e.value.code == "RequestTimeTooSkewed"
    with pytest.raises(S3Error):
        check_time(signed, at - 16 * 60)


def test_chunk_signatures_of_the_reference_example() -> None:
    """The S3 API reference's STREAMING-AWS4-HMAC-SHA256-PAYLOAD example: 66,560 bytes of
    'a' in chunks of 65,536 and 1,024, then the final empty chunk."""
    signed = Signed(
        access_key="AKIAIOSFODNN7EXAMPLE",
        date="20130524",
        region="us-east-1",
        service="s3",
        amz_date="20130524T000000Z",
        signed_headers=("host",),
        signature="4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9",
        payload="STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
    )
    key = signing_key(SECRET, signed)
    first = chunk_signature(key, signed, signed.signature, hashlib.sha256(b"a" * 65536).hexdigest())
    assert first == "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648"
    second = chunk_signature(key, signed, first, hashlib.sha256(b"a" * 1024).hexdigest())
    assert second == "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497"
    last = chunk_signature(key, signed, second, hashlib.sha256(b"").hexdigest())
    assert last == "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9"
    assert dt.datetime(2013, 5, 24, tzinfo=dt.timezone.utc).timestamp() == request_time(
        signed.amz_date
    )
