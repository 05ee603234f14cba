"""Who signed a request: SigV4 checked against the token table (api/s3/sigv4.py), the
caller's principal set as the JSON API's middleware sets it (api/auth.py), so scopes,
per-token shares of the worker pool and rate limits apply alike."""

from __future__ import annotations

from aiohttp import web
from yarl import URL

from checkpoint_vault.protocol import S3_KEY_PREFIX, s3_secret_from_hash

from ..auth import PRINCIPAL, Principal
from ..cluster.durable import Signer
from ..keys import CLOCK, LIMITER, TOKENS
from .body import Body
from .errors import S3Error, access_denied
from .sigv4 import Signed, check_time, parse_header, parse_query, sign, verify

SIGNED = web.RequestKey("s3_signed", Signed)
SIGNING_KEY = web.RequestKey("s3_signing_key", bytes)


def _headers(request: web.Request) -> dict[str, str]:
    """Header values by lower-case name, repeated headers joined with commas (SigV4)."""
    out: dict[str, str] = {}
    for name in request.headers:
        low = name.lower()
        if low not in out:
            out[low] = ",".join(request.headers.getall(name))
    return out


def authenticate(request: web.Request) -> Principal:
    headers = _headers(request)
    if "X-Amz-Algorithm" in request.query:
        signed = parse_query(request.query)
    elif "authorization" in headers:
        signed = parse_header(headers["authorization"], headers)
    elif "AWSAccessKeyId" in request.query:
        raise access_denied(
            "presigned URLs of Signature Version 2 are refused: sign with Version 4 "
            "(boto3: Config(signature_version='s3v4'))"
        )
    else:
        raise access_denied(
            "anonymous requests are refused: sign with a token's S3 credentials "
            "(ckpt token s3 prints them)"
        )
    cache = request.app[TOKENS]
    token = None
    if signed.access_key.startswith(S3_KEY_PREFIX):
        token = cache.by_key.get(signed.access_key[len(S3_KEY_PREFIX) :])
    if token is None:
        raise S3Error(
            "InvalidAccessKeyId",
            403,
            "The AWS Access Key Id you provided does not exist in our records.",
        )
    now = request.app[CLOCK].now()
    if token.expired(now):
        raise access_denied(f"token {token.name!r} expired; ask an admin for a new one")
    check_time(signed, now)
    raw_path, _, raw_query = request.raw_path.partition("?")
    key = verify(
        s3_secret_from_hash(token.secret_hash),
        signed,
        request.method,
        raw_path,
        raw_query,
        headers,
    )
    who = Principal(token.name, token.scopes)
    if not who.is_admin:
        request.app[LIMITER].take(who.name)
    cache.last_used[token.key_id] = now
    request[PRINCIPAL] = who
    request[SIGNED] = signed
    request[SIGNING_KEY] = key
    return who


def as_caller(request: web.Request) -> Signer:
    """How the owner asks a part's node for a file as this request's signer: signed with
    the same token's S3 key (api/cluster/signed.py checks it there)."""
    signed = request[SIGNED]
    token = request.app[TOKENS].by_key.get(signed.access_key[len(S3_KEY_PREFIX) :])
    if token is None:  # revoked since the request was checked
        raise access_denied("the token that signed this request was revoked")
    secret = s3_secret_from_hash(token.secret_hash)
    now = request.app[CLOCK].now()

    def signer(method: str, url: URL) -> dict[str, str]:
        return sign(
            secret, signed.access_key, method, url.raw_authority, url.raw_path,
            url.raw_query_string, now,
        )  # fmt: skip

    return signer


def body_of(request: web.Request) -> Body:
    """The request's body, checked against what was signed (api/s3/body.py)."""
    return Body(
        request.content,
        request.get(SIGNED),
        request.get(SIGNING_KEY),
        request.headers.get("Content-Encoding", ""),
    )
