"""Upload routes: open a session, ask what is missing, send chunks or whole files, commit."""

from __future__ import annotations

import asyncio
import threading
from urllib.parse import unquote

from aiohttp import web

from checkpoint_vault.protocol import DESCRIPTOR_TYPE, FileStored, UploadOpened, decode_chunk_batch
from checkpoint_vault.vault import Conflict, FileEntry, InvalidRequest, UploadSession, Vault
from checkpoint_vault.vault.clock import rfc3339
from checkpoint_vault.vault.domains import Domain
from checkpoint_vault.vault.frame import ROOM as FRAME_ROOM
from checkpoint_vault.vault.names import check_file_name
from checkpoint_vault.vault.parts import part_target

from .. import parse
from ..auth import principal, require, visible_record
from ..http import (
    TimedBody,
    json_body,
    json_response,
    large_json_response,
    query_int,
    read_body,
    read_up_to,
    reading_body,
    run,
)
from ..keys import SETTINGS, VAULT
from ..transfer.receive import expect_descriptor, read_large_body, with_descriptor

PIECE = 8 << 20  # streamed files are chunked in 8 MiB pieces: ~25 ms of writer work each


async def upload_session(request: web.Request) -> UploadSession:
    """The upload named in the path, after checking the caller may write its namespace."""
    session = await run(
        request, request.app[VAULT].uploads.session, request.match_info["upload_id"]
    )
    require(request, "write", part_target(session) or session.namespace)  # a part's: its target
    return session


async def open_upload(request: web.Request) -> web.Response:
    """Open an upload session; answers the namespace's chunking parameters."""
    ns = request.match_info["ns"]
    require(request, "write", ns)
    body = await json_body(request)
    session, profile = await run(
        request,
        request.app[VAULT].open_upload,
        ns,
        parent=parse.parent(body.get("parent")),
        inherit=bool(body.get("inherit", False)),
        metadata=parse.metadata(body.get("metadata")),
        tags=parse.tags(body.get("tags")),
        chunking=parse.chunking(body.get("chunking")),
        by=principal(request).name,
    )
    opened = UploadOpened(
        session.id,
        session.namespace,
        session.parent,
        rfc3339(session.expires_at),
        profile.to_wire(),
    )
    return json_response(opened.to_wire(), status=201)


async def missing(request: web.Request) -> web.Response:
    """Which of these chunk ids the vault lacks; the others are reserved for the upload."""
    session = await upload_session(request)
    body = await json_body(request)
    ids = body.get("chunks")  # checked (100k ids at most, each 64 hex) on the pool
    domain = principal(request).domain()
    result = await run(request, _missing, request.app[VAULT], session.id, ids, domain)
    return await large_json_response(request, {"missing": result})


def _missing(vault: Vault, upload_id: str, ids: object, domain: Domain) -> list[str]:
    """The id checks and the query, both off the event loop (100k ids: ~0.1 s each)."""
    return vault.uploads.missing(upload_id, parse.chunk_ids(ids), domain)


async def put_chunk(request: web.Request) -> web.Response:
    """Store one chunk; its id must be the BLAKE3 of the body."""
    session = await upload_session(request)
    data = await read_body(request, request.app[VAULT].config.max_chunk_size)
    cid = request.match_info["chunk_id"]
    domain = principal(request).domain()
    created = await run(
        request, request.app[VAULT].uploads.put_chunk, session.id, cid, data, domain
    )
    return json_response({"id": cid, "created": created}, status=201 if created else 200)


async def put_chunks(request: web.Request) -> web.Response:
    """Store many chunks in one request (body: records of raw id, u32 length, bytes)."""
    session = await upload_session(request)
    at = _file_position(request)
    body = await read_large_body(request, request.app[SETTINGS].max_batch_body)
    try:  # each chunk with the room for its frame header: frames are built inside the body
        chunks = await run(request, decode_chunk_batch, body, FRAME_ROOM)
    except ValueError as e:
        raise InvalidRequest(f"malformed chunk batch: {e}") from None
    domain = principal(request).domain()
    vault = request.app[VAULT]
    created = await run(request, vault.uploads.put_chunks, session.id, chunks, domain, True, at)
    return json_response({"chunks": len(chunks), "created": created})


def _file_position(request: web.Request) -> tuple[str, int] | None:
    """`?file=&offset=`: where a batch's chunks lie, in order, in a file of the upload (its
    hash then runs as they arrive, vault/filehash.py); both or neither."""
    name, offset = request.query.get("file"), request.query.get("offset")
    if name is None and offset is None:
        return None
    if name is None or offset is None:
        raise InvalidRequest("file and offset go together")
    check_file_name(name)
    at = query_int(request, "offset", 0)
    if at < 0:
        raise InvalidRequest("query parameter offset must not be negative")
    return name, at


def _raw_file_name(request: web.Request, upload_id: str) -> str:
    """The file name as the client sent it: the router's view has dot segments resolved
    (`a/../b` arrives as `b`), which would silently store a different name than asked."""
    prefix = f"/v1/uploads/{upload_id}/files/"
    raw = request.raw_path.split("?", 1)[0]
    return unquote(raw[len(prefix) :]) if raw.startswith(prefix) else request.match_info["name"]


async def put_file(request: web.Request) -> web.Response:
    """Stream a whole file, or hand it over by descriptor on the local socket; the server
    chunks it. Memory stays at a few pieces whatever the file's size."""
    session = await upload_session(request)
    vault = request.app[VAULT]
    name = _raw_file_name(request, session.id)
    if request.content_type == DESCRIPTOR_TYPE:
        entry = await _ingest_descriptor(request, vault, session.id, name)
        stored = FileStored(name, entry.size, entry.hash.hex(), len(entry.chunks))
        return json_response(stored.to_wire(), status=201)
    ingest = await run(request, vault.ingest, session.id, name, principal(request).domain())
    pending: asyncio.Future[None] | None = None
    body = TimedBody(request)
    try:
        with reading_body(request):
            while True:
                piece = await read_up_to(body, PIECE)
                final = len(piece) < PIECE
                if pending is not None:
                    await pending
                pending = asyncio.ensure_future(run(request, ingest.feed, piece, final))
                if final:
                    break
    finally:
        if pending is not None:
            await pending
    entry = await run(request, ingest.finish)
    stored = FileStored(ingest.name, entry.size, entry.hash.hex(), len(entry.chunks))
    return json_response(stored.to_wire(), status=201)


async def _ingest_descriptor(
    request: web.Request, vault: Vault, upload_id: str, name: str
) -> FileEntry:
    """The file handed over, read into the upload on a hand-over thread."""
    domain = principal(request).domain()

    def ingest(fd: int, stop: threading.Event) -> FileEntry:
        return vault.ingest_descriptor(upload_id, name, fd, domain, stop)

    return await with_descriptor(request, ingest)


async def commit(request: web.Request) -> web.Response:
    """Atomically create the checkpoint; a retry returns the same one with 200."""
    session = await upload_session(request)
    if part_target(session) is not None:
        raise Conflict(f"upload {session.id} is a part: commit it with POST .../part")
    body = await json_body(request)
    files = parse.commit_files(body.get("files"))
    domain = principal(request).domain()
    record, created = await run(
        request, request.app[VAULT].committer.commit, session.id, files, domain
    )
    return json_response(visible_record(request, record).to_wire(), status=201 if created else 200)


async def abort(request: web.Request) -> web.Response:
    """Abort the upload: nothing of it becomes visible."""
    session = await upload_session(request)
    await run(request, request.app[VAULT].uploads.abort, session.id)
    return web.Response(status=204)


def add_routes(app: web.Application, ns: str) -> None:
    app.router.add_post(f"/v1/namespaces/{ns}/uploads", open_upload)
    app.router.add_post("/v1/uploads/{upload_id}/missing", missing)
    app.router.add_put("/v1/uploads/{upload_id}/chunks/{chunk_id}", put_chunk)
    app.router.add_post("/v1/uploads/{upload_id}/chunks", put_chunks)
    app.router.add_put(
        "/v1/uploads/{upload_id}/files/{name:.+}", put_file, expect_handler=expect_descriptor
    )
    app.router.add_post("/v1/uploads/{upload_id}/commit", commit)
    app.router.add_delete("/v1/uploads/{upload_id}", abort)
