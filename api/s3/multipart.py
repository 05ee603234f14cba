"""Multipart uploads: Create, UploadPart, Complete, Abort.

Each part is streamed into the bucket's open upload under a reserved name (so its chunks
are the upload's, kept from GC) and its entry kept in memory (api/s3/state.py). Complete
joins the parts' chunk lists into one file entry, no bytes copied: content-defined chunks
cut inside each part stay valid chunks of the whole, and the whole file's BLAKE3 is read
back once, on the pool. Parts must be at least MIN_PART bytes except the last, as in S3.
"""

from __future__ import annotations

from aiohttp import web

from checkpoint_vault.vault import FileEntry, Vault

from ..auth import principal
from ..http import run
from ..keys import CLOCK, VAULT
from . import xml
from .errors import S3Error, invalid_argument
from .keys import STATE
from .naming import check_key, namespace
from .ops import allow, commit_if_marker, ensure_open, store
from .signing import body_of
from .state import Multipart
from .tree import PARTS, etag, to_name

MIN_PART = 5 << 20  # S3's smallest part but the last
MAX_PARTS = 10_000


def _no_such_upload() -> S3Error:
    return S3Error(
        "NoSuchUpload",
        404,
        "The specified multipart upload does not exist. The upload ID may be invalid, or "
        "the upload may have been aborted or completed.",
    )


def _upload(request: web.Request, bucket: str, key: str) -> tuple[str, Multipart]:
    upload_id = request.query.get("uploadId", "")
    mp = request.app[STATE].multipart.get(upload_id)
    if mp is None or mp.bucket != bucket or mp.key != key:
        raise _no_such_upload()
    return upload_id, mp


async def create(request: web.Request, bucket: str, key: str) -> web.Response:
    ns = namespace(bucket)
    check_key(key)
    allow(request, "write", ns)
    upload_id = request.app[STATE].new_multipart(bucket, key, principal(request).name)
    return web.Response(body=xml.initiated(bucket, key, upload_id), content_type="application/xml")


async def upload_part(request: web.Request, bucket: str, key: str) -> web.Response:
    ns = namespace(bucket)
    allow(request, "write", ns)
    upload_id, mp = _upload(request, bucket, key)
    number = request.query.get("partNumber", "")
    if not number.isdigit() or not 1 <= int(number) <= MAX_PARTS:
        raise invalid_argument(f"partNumber must be an integer from 1 to {MAX_PARTS}")
    async with request.app[STATE].lock(ns).shared():
        entry = await store(request, ns, f"{PARTS}{upload_id}/{int(number):05d}", body_of(request))
    mp.parts[int(number)] = entry
    return web.Response(status=200, headers={"ETag": etag(entry)})


def _joined(vault: Vault, parts: list[FileEntry]) -> FileEntry:
    chunks = tuple(c for p in parts for c in p.chunks)
    whole = FileEntry(sum(p.size for p in parts), b"", chunks)
    return FileEntry(whole.size, vault.reader.file_hash(whole), chunks)


async def complete(request: web.Request, bucket: str, key: str) -> web.Response:
    ns = namespace(bucket)
    allow(request, "write", ns)
    upload_id, mp = _upload(request, bucket, key)
    listed = xml.parse_complete(await request.content.read(xml.MAX_XML_BODY))
    numbers = [n for n, _ in listed]
    if numbers != sorted(set(numbers)):
        raise S3Error("InvalidPartOrder", 400, "The list of parts was not in ascending order.")
    parts = []
    for i, (n, tag) in enumerate(listed):
        entry = mp.parts.get(n)
        if entry is None or (tag and tag.strip('"') != etag(entry).strip('"')):
            raise S3Error("InvalidPart", 400, f"part {n} was not uploaded or its ETag differs")
        if entry.size < MIN_PART and i < len(listed) - 1:
            raise S3Error("EntityTooSmall", 400, f"part {n} is smaller than {MIN_PART} bytes")
        parts.append(entry)
    vault = request.app[VAULT]
    whole = await run(request, _joined, vault, parts)
    async with request.app[STATE].lock(ns).shared():
        up = await ensure_open(request, ns)
        await run(request, vault.uploads.add_file, up.upload_id, to_name(key), whole)
        await _drop_parts(request, up.upload_id, upload_id, mp)
        up.last_write = request.app[CLOCK].now()
    del request.app[STATE].multipart[upload_id]
    await commit_if_marker(request, ns, key)
    return web.Response(
        body=xml.completed(bucket, key, etag(whole)), content_type="application/xml"
    )


async def _drop_parts(request: web.Request, upload: str, upload_id: str, mp: Multipart) -> None:
    """Take the parts' reserved files out of the open upload (a commit since dropped them)."""
    vault = request.app[VAULT]
    for n in mp.parts:
        await run(request, vault.uploads.remove_file, upload, f"{PARTS}{upload_id}/{n:05d}")


async def abort(request: web.Request, bucket: str, key: str) -> web.Response:
    ns = namespace(bucket)
    allow(request, "write", ns)
    upload_id, mp = _upload(request, bucket, key)
    up = request.app[STATE].opened.get(ns)
    if up is not None:
        async with request.app[STATE].lock(ns).shared():
            await _drop_parts(request, up.upload_id, upload_id, mp)
    del request.app[STATE].multipart[upload_id]
    return web.Response(status=204)
