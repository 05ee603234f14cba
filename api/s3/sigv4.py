"""AWS Signature Version 4, as S3 clients sign requests: the server's side of it.

Pure functions over a request's parts, so they are tested without a server. A request is
signed in the `Authorization` header (what boto3, s3fs, obstore and Hadoop's S3A send) or
in the query string (a presigned URL). The canonical request follows the S3 reference:
the path URI-encoded once per segment (`/` kept), query pairs encoded and sorted, the
signed headers lower-cased with their values trimmed and inner spaces folded, and the
payload's SHA-256 as the client declared it in `x-amz-content-sha256` (or
`UNSIGNED-PAYLOAD`, or one of the `STREAMING-*` values of an aws-chunked body, whose
chunks api/s3/body.py checks with `chunk_signature`).

The secret is derived from the vault token (protocol/_s3.py); the date must lie within
MAX_SKEW of the server's clock (a replayed request is refused after that), and a
presigned URL no later than its X-Amz-Expires.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import quote, unquote

from .errors import S3Error, access_denied

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW = 15 * 60.0  # seconds between a request's X-Amz-Date and the server's clock (S3's)
MAX_PRESIGNED = 7 * 24 * 3600  # longest X-Amz-Expires S3 accepts
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
UNSIGNED = "UNSIGNED-PAYLOAD"
STREAMING_SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
STREAMING_SIGNED_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
STREAMING = frozenset({STREAMING_SIGNED, STREAMING_SIGNED_TRAILER, STREAMING_UNSIGNED_TRAILER})
_SPACES = re.compile(r"\s+")
_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Signed:
    """What a request claims: who signed it, when, in which scope, over which headers."""

    access_key: str
    date: str  # YYYYMMDD of the scope
    region: str
    service: str
    amz_date: str  # YYYYMMDDTHHMMSSZ
    signed_headers: tuple[str, ...]
    signature: str
    payload: str  # x-amz-content-sha256 (a hex digest, UNSIGNED-PAYLOAD or STREAMING-*)
    expires: int | None = None  # presigned: seconds the URL is valid for

    @property
    def scope(self) -> str:
        return f"{self.date}/{self.region}/{self.service}/aws4_request"


def _malformed(message: str) -> S3Error:
    return S3Error("AuthorizationHeaderMalformed", 400, message)


def parse_header(header: str, headers: Mapping[str, str]) -> Signed:
    """The `Authorization: AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=...`
    of a request, with its date and payload hash headers."""
    algorithm, _, rest = header.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise access_denied("only AWS Signature Version 4 (AWS4-HMAC-SHA256) is accepted")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, _, value = part.strip().partition("=")
        fields[name] = value
    if not {"Credential", "SignedHeaders", "Signature"} <= set(fields):
        raise _malformed("the authorization header needs Credential, SignedHeaders, Signature")
    amz_date = headers.get("x-amz-date") or ""
    payload = headers.get("x-amz-content-sha256") or ""
    if not payload:
        raise invalid_request("missing required header x-amz-content-sha256")
    return _signed(
        fields["Credential"], fields["SignedHeaders"], fields["Signature"], amz_date, payload
    )


def parse_query(query: Mapping[str, str]) -> Signed:
    """A presigned URL's X-Amz-* parameters."""
    if query.get("X-Amz-Algorithm") != ALGORITHM:
        raise access_denied("only AWS Signature Version 4 (AWS4-HMAC-SHA256) is accepted")
    try:
        expires = int(query.get("X-Amz-Expires", ""))
    except ValueError:
        raise access_denied("X-Amz-Expires must be a number of seconds") from None
    if not 0 < expires <= MAX_PRESIGNED:
        raise access_denied(f"X-Amz-Expires must be 1 to {MAX_PRESIGNED} seconds")
    signed = _signed(
        query.get("X-Amz-Credential", ""),
        query.get("X-Amz-SignedHeaders", ""),
        query.get("X-Amz-Signature", ""),
        query.get("X-Amz-Date", ""),
        UNSIGNED,
    )
    return Signed(**{**signed.__dict__, "expires": expires})


def invalid_request(message: str) -> S3Error:
    return S3Error("InvalidRequest", 400, message)


def _signed(credential: str, headers: str, signature: str, amz_date: str, payload: str) -> Signed:
    parts = credential.split("/")
    if len(parts) != 5 or parts[4] != "aws4_request" or not parts[0]:
        raise _malformed("Credential must be <access key>/<date>/<region>/<service>/aws4_request")
    if parts[3] != "s3":
        raise _malformed(f"the credential's service must be s3, not {parts[3]!r}")
    if not re.fullmatch(r"\d{8}T\d{6}Z", amz_date) or not amz_date.startswith(parts[1]):
        raise access_denied("X-Amz-Date must be YYYYMMDDTHHMMSSZ on the credential's date")
    if not re.fullmatch(r"[0-9a-f]{64}", signature):
        raise _malformed("Signature must be 64 lowercase hex digits")
    if payload not in STREAMING and payload != UNSIGNED and not _HEX64.fullmatch(payload):
        raise invalid_request("x-amz-content-sha256 is neither a SHA-256 nor a known mode")
    names = tuple(h for h in headers.split(";") if h)
    if "host" not in names:
        raise access_denied("the signed headers must include host")
    return Signed(parts[0], parts[1], parts[2], parts[3], amz_date, names, signature, payload)


def request_time(amz_date: str) -> float:
    return datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc).timestamp()


def check_time(signed: Signed, now: float) -> None:
    """Refuse a request signed too far from now, or a presigned URL past its expiry."""
    at = request_time(signed.amz_date)
    if signed.expires is not None:
        if now > at + signed.expires:
            raise access_denied("Request has expired")
        if at - now > MAX_SKEW:
            raise S3Error("RequestTimeTooSkewed", 403, "the request's date is in the future")
        return
    if abs(now - at) > MAX_SKEW:
        raise S3Error(
            "RequestTimeTooSkewed",
            403,
            "The difference between the request time and the server's time is too large.",
        )


def canonical_uri(raw_path: str) -> str:
    """The path as SigV4 signs it for S3: each segment URI-encoded once."""
    return quote(unquote(raw_path), safe="/~")


def canonical_query(raw_query: str, presigned: bool) -> str:
    pairs = []
    for item in raw_query.split("&") if raw_query else []:
        name, _, value = item.partition("=")
        name, value = unquote(name.replace("+", " ")), unquote(value.replace("+", " "))
        if presigned and name == "X-Amz-Signature":
            continue
        pairs.append((quote(name, safe="-_.~"), quote(value, safe="-_.~")))
    return "&".join(f"{n}={v}" for n, v in sorted(pairs))


def canonical_request(
    method: str, raw_path: str, raw_query: str, headers: Mapping[str, str], signed: Signed
) -> str:
    lines = [
        method,
        canonical_uri(raw_path),
        canonical_query(raw_query, signed.expires is not None),
    ]
    for name in signed.signed_headers:
        value = headers.get(name)
        if value is None:
            raise access_denied(f"signed header {name!r} is missing from the request")
        lines.append(f"{name}:{_SPACES.sub(' ', value.strip())}")
    lines += ["", ";".join(signed.signed_headers), signed.payload]
    return "\n".join(lines)


def signing_key(secret: str, signed: Signed) -> bytes:
    key = ("AWS4" + secret).encode()
    for part in (signed.date, signed.region, signed.service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def signature(key: bytes, signed: Signed, canonical: str) -> str:
    to_sign = "\n".join(
        [ALGORITHM, signed.amz_date, signed.scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def verify(
    secret: str,
    signed: Signed,
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Mapping[str, str],
) -> bytes:
    """Check the signature; returns the signing key (an aws-chunked body's chunks are
    signed with it, chained from this signature)."""
    key = signing_key(secret, signed)
    expected = signature(
        key, signed, canonical_request(method, raw_path, raw_query, headers, signed)
    )
    if not hmac.compare_digest(expected, signed.signature):
        raise S3Error(
            "SignatureDoesNotMatch",
            403,
            "The request signature we calculated does not match the signature you provided.",
        )
    return key


def chunk_signature(key: bytes, signed: Signed, previous: str, chunk_sha256: str) -> str:
    """The signature of one chunk of a STREAMING-AWS4-HMAC-SHA256-PAYLOAD body."""
    to_sign = "\n".join(
        [
            ALGORITHM + "-PAYLOAD",
            signed.amz_date,
            signed.scope,
            previous,
            EMPTY_SHA256,
            chunk_sha256,
        ]
    )
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def sign(
    secret: str, access_key: str, method: str, host: str, raw_path: str, raw_query: str, now: float
) -> dict[str, str]:
    """The headers that sign a bodiless request (`UNSIGNED-PAYLOAD`) as `access_key`: an
    owner reading a part's file for an S3 caller (api/s3/signing.py `as_caller`)."""
    amz_date = datetime.fromtimestamp(now, timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    names = ("host", "x-amz-content-sha256", "x-amz-date")
    signed = Signed(access_key, amz_date[:8], "cluster", "s3", amz_date, names, "", UNSIGNED)
    headers = {"host": host, "x-amz-content-sha256": UNSIGNED, "x-amz-date": amz_date}
    canonical = canonical_request(method, raw_path, raw_query, headers, signed)
    proof = signature(signing_key(secret, signed), signed, canonical)
    credential = f"Credential={access_key}/{signed.scope}"
    headers["Authorization"] = (
        f"{ALGORITHM} {credential}, SignedHeaders={';'.join(names)}, Signature={proof}"
    )
    return headers
