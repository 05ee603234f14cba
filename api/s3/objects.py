"""Object handlers: GetObject (with Range), HeadObject, PutObject, CopyObject,
DeleteObject, and the delete step DeleteObjects repeats per key.

A delete follows the bucket's checkpoints (api/s3/tree.py): an object the open upload holds
is taken out of it; an object of a committed checkpoint is recorded as deleted, and the
checkpoint that wrote it is deleted from the vault once the delete takes its completion
marker (Flink discarding `chk-N/`) or its last object; never the newest checkpoint, which
holds the bucket's objects. An object a pinned checkpoint wrote is not deleted: the answer
is AccessDenied naming the checkpoint, as S3 answers for an object under legal hold.
"""

from __future__ import annotations

from urllib.parse import unquote

from aiohttp import web

from checkpoint_vault.vault import FileEntry
from checkpoint_vault.vault.content.reader import batches

from ..cluster.durable import proxy_file
from ..errors import InvalidRange
from ..http import run
from ..keys import CLOCK, VAULT
from ..transfer.download import parse_range
from . import xml
from .errors import S3Error, access_denied, invalid_argument, no_such_key
from .keys import MAIN, STATE
from .naming import check_key, namespace
from .ops import allow, commit_if_marker, current, ensure_open, store
from .signing import as_caller, body_of
from .tree import (
    base_entry,
    emptied,
    etag,
    is_marker,
    mark_deleted,
    markers,
    owner,
    to_name,
    tree,
)


def _headers(entry: FileEntry, modified: float) -> dict[str, str]:
    return {
        "ETag": etag(entry),
        "Last-Modified": xml.http_date(modified),
        "Accept-Ranges": "bytes",
        "Content-Type": "binary/octet-stream",
    }


async def get_object(request: web.Request, bucket: str, key: str) -> web.StreamResponse:
    ns = namespace(bucket)
    allow(request, "read", ns)
    now = await current(request, ns)
    entry = now.files.get(key)
    if entry is None:
        raise no_such_key(key)
    headers = _headers(entry, now.modified[key])
    if request.headers.get("If-None-Match") == headers["ETag"]:
        return web.Response(status=304, headers=headers)
    try:
        rng = parse_range(request.headers.get("Range"), entry.size)
    except InvalidRange:
        raise S3Error("InvalidRange", 416, "The requested range is not satisfiable", key) from None
    first, last = rng if rng is not None else (0, entry.size - 1)
    latest = now.latest
    if (
        request.method == "GET"
        and entry.size
        and latest is not None
        and not latest.durable
        and key not in now.written
    ):
        # a commit of parts not adopted yet: from its part's node, as the files route does
        proxied = await proxy_file(
            request, latest, to_name(key), as_caller(request), headers, request.app[MAIN]
        )
        if proxied is not None:
            return proxied
    resp = web.StreamResponse(status=206 if rng else 200, headers=headers)
    if rng is not None:
        resp.headers["Content-Range"] = f"bytes {first}-{last}/{entry.size}"
    resp.content_length = last - first + 1 if entry.size else 0
    await resp.prepare(request)
    if request.method == "GET" and entry.size:
        await _send(request, resp, entry, first, last)
    await resp.write_eof()
    return resp


async def _send(
    request: web.Request, resp: web.StreamResponse, entry: FileEntry, first: int, last: int
) -> None:
    """The bytes [first, last] of the object, read in batches on the pool, each verified
    by the reader; a failure once the status is out can only cut the connection."""
    spans = [(c, o, n) for c, o, n in entry.spans() if o <= last and o + n > first]
    reader = request.app[VAULT].reader
    pos = spans[0][1]
    try:
        for group in batches([(c, n) for c, _, n in spans]):
            for plain in await run(request, reader.chunks, group):
                view = memoryview(plain)
                lo, hi = max(first - pos, 0), min(last + 1 - pos, len(view))
                if lo < hi:
                    await resp.write(view[lo:hi])
                pos += len(view)
    except BaseException:
        if request.transport is not None:
            request.transport.abort()
        raise


async def put_object(request: web.Request, bucket: str, key: str) -> web.Response:
    ns = namespace(bucket)
    check_key(key)
    allow(request, "write", ns)
    if "x-amz-copy-source" in request.headers:
        return await _copy(request, ns, key)
    state_lock = request.app[STATE].lock(ns)
    async with state_lock.shared():
        entry = await store(request, ns, to_name(key), body_of(request))
    await commit_if_marker(request, ns, key)
    return web.Response(status=200, headers={"ETag": etag(entry)})


async def _copy(request: web.Request, ns: str, key: str) -> web.Response:
    """CopyObject: the source's entry attached under the new key (no bytes move)."""
    source = unquote(request.headers["x-amz-copy-source"]).split("?", 1)[0].lstrip("/")
    src_bucket, _, src_key = source.partition("/")
    src_ns = namespace(src_bucket)
    allow(request, "read", src_ns)
    entry = (await current(request, src_ns)).files.get(src_key)
    if entry is None:
        raise no_such_key(src_key)
    vault = request.app[VAULT]
    async with request.app[STATE].lock(ns).shared():
        up = await ensure_open(request, ns)
        await run(request, vault.uploads.add_file, up.upload_id, to_name(key), entry)
        up.last_write = request.app[CLOCK].now()
    await commit_if_marker(request, ns, key)
    return web.Response(body=xml.copied(etag(entry), up.last_write), content_type="application/xml")


async def delete_object(request: web.Request, bucket: str, key: str) -> web.Response:
    ns = namespace(bucket)
    allow(request, "delete", ns)
    await delete_key(request, ns, key)
    return web.Response(status=204)


async def delete_key(request: web.Request, ns: str, key: str) -> None:
    """Delete one object (module doc); deleting a key that is not there succeeds, as in S3."""
    state = request.app[STATE]
    vault = request.app[VAULT]
    async with state.lock(ns).exclusive():
        now = await current(request, ns)
        if key not in now.files:
            return
        base = None
        if now.latest is not None and key not in now.deleted:
            base = await run(request, base_entry, vault, now.latest.id, key)
        victim = None
        if base is not None:
            victim = await run(request, owner, vault, ns, key, base)
            if victim is not None and victim.pinned:
                raise access_denied(
                    f"checkpoint {victim.id} is pinned: its objects are kept (unpin it to "
                    "delete them)"
                )
        up = await ensure_open(request, ns)
        if key in now.written:
            await run(request, vault.uploads.remove_file, up.upload_id, to_name(key))
        if base is not None:
            await run(request, mark_deleted, vault, up.upload_id, key)
        up.last_write = request.app[CLOCK].now()
        if victim is None or (now.latest is not None and victim.id == now.latest.id):
            return
        after = await run(request, tree, vault, ns, up.upload_id, up.opened_at)
        patterns = await run(request, markers, vault, ns)
        if is_marker(key, patterns) or await run(request, emptied, vault, victim, after):
            await run(request, vault.lifecycle.delete, ns, victim.id)


async def delete_objects(request: web.Request, bucket: str) -> web.Response:
    """DeleteObjects: each key as DeleteObject; a refused one is an <Error> entry."""
    ns = namespace(bucket)
    allow(request, "delete", ns)
    body = await request.content.read(xml.MAX_XML_BODY + 1)
    if len(body) > xml.MAX_XML_BODY:
        raise invalid_argument("the Delete document is too large")
    keys, quiet = xml.parse_delete(body)
    done: list[str] = []
    failed: list[tuple[str, S3Error]] = []
    for key in keys:
        try:
            await delete_key(request, ns, key)
        except S3Error as e:
            failed.append((key, e))
        else:
            done.append(key)
    return web.Response(body=xml.deleted(done, failed, quiet), content_type="application/xml")
