"""Bucket handlers: ListObjectsV2 (prefix, delimiter, start-after, continuation), ListBuckets,
HeadBucket, CreateBucket, GetBucketLocation, DeleteBucket.

A listing is exactly the bucket's objects (api/s3/tree.py), sorted by key in UTF-8 byte
order as S3 sorts them. A continuation token is the last key or common prefix answered,
base64url-encoded (opaque to clients, as S3's are); resuming skips it and, for a common
prefix, every key under it.
"""

from __future__ import annotations

import base64
import binascii

from aiohttp import web

from ..auth import principal
from ..http import run
from ..keys import VAULT
from . import cluster, xml
from .errors import S3Error, invalid_argument
from .naming import namespace
from .ops import allow, current
from .tree import etag

MAX_KEYS = 1000


def _token(value: str) -> str:
    return base64.urlsafe_b64encode(value.encode()).decode()


def _untoken(token: str) -> str:
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise invalid_argument("The continuation token provided is incorrect") from None


def _max_keys(request: web.Request) -> int:
    raw = request.query.get("max-keys", str(MAX_KEYS))
    if not raw.isdigit():
        raise invalid_argument("max-keys must be a non-negative integer")
    return min(int(raw), MAX_KEYS)


async def list_objects(request: web.Request, bucket: str) -> web.Response:
    ns = namespace(bucket)
    allow(request, "read", ns)
    if request.query.get("list-type") != "2":
        raise S3Error("NotImplemented", 501, "use ListObjectsV2 (list-type=2)")
    query = dict(request.query)
    prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
    after = query.get("start-after", "")
    if "continuation-token" in query:
        after = _untoken(query["continuation-token"])
    limit = _max_keys(request)
    now = await current(request, ns)
    objects: list[xml.Listed] = []
    prefixes: list[str] = []
    last = ""
    truncated = False
    for key in sorted(now.files, key=lambda k: k.encode()):
        if not key.startswith(prefix) or key.encode() <= after.encode():
            continue
        if after.endswith(delimiter or "\0") and delimiter and key.startswith(after):
            continue  # under the common prefix answered last
        cut = key.find(delimiter, len(prefix)) if delimiter else -1
        item = key[: cut + len(delimiter)] if cut >= 0 else key
        if prefixes and item == prefixes[-1]:
            continue
        if len(objects) + len(prefixes) == limit:
            truncated = True
            break
        if cut >= 0:
            prefixes.append(item)
        else:
            e = now.files[key]
            objects.append(xml.Listed(key, e.size, etag(e), now.modified[key]))
        last = item
    token = _token(last) if truncated else None
    body = xml.list_objects_v2(bucket, query, objects, prefixes, token, limit)
    return web.Response(body=body, content_type="application/xml")


async def list_buckets(request: web.Request) -> web.Response:
    """The namespaces that are valid bucket names and that the token may read (in a
    cluster, of every shard: api/s3/cluster.py)."""
    who = principal(request)
    listed = await run(request, request.app[VAULT].namespaces)
    buckets = []
    for record, _ in listed:
        try:
            namespace(record.name)
        except S3Error:
            continue
        if who.may("read", record.name):
            buckets.append((record.name, record.created_at))
    buckets = await cluster.whole(request, buckets)  # every shard's, in a cluster
    return web.Response(body=xml.list_buckets(buckets, who.name), content_type="application/xml")


async def head_bucket(request: web.Request, bucket: str) -> web.Response:
    """Any valid bucket name exists (a namespace is made by its first upload); the token
    must be able to use it."""
    ns = namespace(bucket)
    who = principal(request)
    if not any(who.may(a, ns) for a in ("read", "write", "delete")):
        raise S3Error("AccessDenied", 403, f"token {who.name!r} may not use bucket {ns!r}")
    return web.Response(status=200)


async def create_bucket(request: web.Request, bucket: str) -> web.Response:
    ns = namespace(bucket)
    allow(request, "write", ns)
    await request.read()
    return web.Response(status=200, headers={"Location": f"/{bucket}"})


async def location(request: web.Request, bucket: str) -> web.Response:
    await head_bucket(request, bucket)
    return web.Response(body=xml.location(), content_type="application/xml")


async def delete_bucket(request: web.Request, bucket: str) -> web.Response:
    """Refused while the bucket holds objects (BucketNotEmpty); its checkpoints stay."""
    ns = namespace(bucket)
    allow(request, "delete", ns)
    if (await current(request, ns)).files:
        raise S3Error("BucketNotEmpty", 409, "The bucket you tried to delete is not empty", ns)
    return web.Response(status=204)
