"""Steps several S3 handlers share: open a bucket's upload, stream an object into it,
read the bucket's tree, commit on a completion marker."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from checkpoint_vault.vault import FileEntry, NotFound, StoredCheckpoint
from checkpoint_vault.vault.errors import UploadExpired, UploadNotFound

from ..auth import principal
from ..http import run
from ..keys import CLOCK, RUNTIME, SETTINGS, VAULT
from .body import Body
from .errors import S3Error, access_denied
from .keys import STATE
from .state import OpenUpload
from .tree import Tree, commit, is_marker, markers, tree


def allow(request: web.Request, action: str, ns: str) -> None:
    """The token's scope for this namespace, as an S3 AccessDenied."""
    if not principal(request).may(action, ns):
        raise access_denied(f"token {principal(request).name!r} may not {action} bucket {ns!r}")


async def current(request: web.Request, ns: str) -> Tree:
    """The bucket's objects now (api/s3/tree.py)."""
    up = request.app[STATE].opened.get(ns)
    return await run(
        request,
        tree,
        request.app[VAULT],
        ns,
        up.upload_id if up else None,
        up.opened_at if up else 0.0,
    )


async def ensure_open(request: web.Request, ns: str) -> OpenUpload:
    """The bucket's open upload, opened now if there is none (its parent: the newest
    checkpoint, so the next commit has lineage to it)."""
    state = request.app[STATE]
    async with state.lock(ns).opening:
        up = state.opened.get(ns)
        if up is not None:
            return up
        vault = request.app[VAULT]
        now = request.app[CLOCK].now()
        who = principal(request).name
        try:
            session, _ = await run(
                request,
                vault.open_upload,
                ns,
                parent="latest",
                metadata={"s3": {"bucket": ns}},
                by=who,
            )
        except NotFound:  # a new namespace, or one with no live checkpoint
            session, _ = await run(
                request, vault.open_upload, ns, metadata={"s3": {"bucket": ns}}, by=who
            )
        up = OpenUpload(session.id, now, now, who)
        state.opened[ns] = up
        return up


def forget(request: web.Request, ns: str, up: OpenUpload) -> None:
    """Drop a bucket's open upload that expired or was ended elsewhere (an admin abort)."""
    if request.app[STATE].opened.get(ns) is up:
        del request.app[STATE].opened[ns]


async def store(request: web.Request, ns: str, name: str, body: Body) -> FileEntry:
    """Stream `body` into the bucket's open upload as file `name`; a second try with a new
    upload if the one on record expired (nothing of the first try was attached)."""
    for attempt in (1, 2):
        up = await ensure_open(request, ns)
        try:
            entry = await _ingest(request, up.upload_id, name, body)
        except (UploadExpired, UploadNotFound):
            forget(request, ns, up)
            if attempt == 2:
                raise
            continue
        up.last_write = request.app[CLOCK].now()
        return entry
    raise AssertionError("unreachable")


def looks_like_tensors(head: bytes) -> bool:
    """A torch.save archive (a zip) or a safetensors file (a little-endian header length,
    then its JSON): worth cutting at tensor boundaries, which needs the whole file."""
    return head.startswith(b"PK\x03\x04") or head[8:9] == b"{"


async def _ingest(request: web.Request, upload_id: str, name: str, body: Body) -> FileEntry:
    """Stream the body into the upload, or, for a tensor file, spool it to an unnamed file
    first and ingest that as a file handed over (vault/ingest.py): cut at its tensors, as
    the vault's client cuts it, so a fine-tune's checkpoints dedup as well through S3 as
    through the client (the frozen tensors' chunks repeat exactly)."""
    vault = request.app[VAULT]
    domain = principal(request).domain()
    pieces = body.pieces()
    first = await anext(pieces, b"")
    if looks_like_tensors(first):
        return await _spooled(request, upload_id, name, first, pieces)
    ingest = await run(request, vault.ingest, upload_id, name, domain)
    pending: asyncio.Future[None] | None = None
    try:
        piece: bytes | None = first
        while piece:
            if pending is not None:
                await pending
            pending = asyncio.ensure_future(run(request, ingest.feed, piece, False))
            piece = await anext(pieces, None)
        if pending is not None:
            await pending
            pending = None
        await run(request, ingest.feed, b"", True)
    finally:
        if pending is not None:
            with contextlib.suppress(Exception):
                await pending
    return await run(request, ingest.finish)


async def _spooled(
    request: web.Request,
    upload_id: str,
    name: str,
    first: bytes,
    pieces: AsyncIterator[bytes],
) -> FileEntry:
    vault = request.app[VAULT]
    spool = await run(request, tempfile.TemporaryFile, dir=request.app[SETTINGS].data_dir)
    try:
        piece: bytes | None = first
        while piece:
            await run(request, spool.write, piece)
            piece = await anext(pieces, None)
        await run(request, spool.flush)
        domain = principal(request).domain()
        fd = os.dup(spool.fileno())  # ingest_descriptor takes it over and closes it
        return await run(request, vault.ingest_descriptor, upload_id, name, fd, domain)
    finally:
        spool.close()


async def commit_if_marker(request: web.Request, ns: str, key: str) -> StoredCheckpoint | None:
    """Commit the bucket's open upload when `key` is one of its completion markers."""
    vault = request.app[VAULT]
    if not is_marker(key, await run(request, markers, vault, ns)):
        return None
    return await commit_now(request.app, ns, request)


async def commit_now(
    app: web.Application, ns: str, request: web.Request | None = None
) -> StoredCheckpoint | None:
    """Commit the bucket's open upload alone (no write in flight); None if none is open."""
    state = app[STATE]
    async with state.lock(ns).exclusive():
        up = state.opened.get(ns)
        if up is None:
            return None
        fn = _commit_call(app, ns, up.upload_id)
        if request is not None:
            record = await run(request, fn)
        else:  # the idle rule: no caller's share to run in
            record = await asyncio.get_running_loop().run_in_executor(app[RUNTIME].io, fn)
        if state.opened.get(ns) is up:
            del state.opened[ns]
        return record


def _commit_call(app: web.Application, ns: str, upload_id: str) -> Callable[[], StoredCheckpoint]:
    vault = app[VAULT]

    def call() -> StoredCheckpoint:
        # Chunks count as stored if this namespace references them or the upload sent them.
        return commit(vault, ns, upload_id, lambda other: other == ns)

    return call


def no_such_bucket(ns: str) -> S3Error:
    return S3Error("NoSuchBucket", 404, "The specified bucket does not exist", ns)
