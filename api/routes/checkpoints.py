"""Checkpoint routes: list, show, manifest, file contents, lineage, patch, delete, fork."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from checkpoint_vault.protocol import BulkDeleted, Manifest, NamespaceEntry
from checkpoint_vault.vault.direct import SaveOptions

from .. import parse
from ..audit import BULK_DELETED
from ..auth import principal, require, visible_record
from ..cluster.durable import proxy_file
from ..http import bundle_body, json_body, json_response, query_int, run
from ..keys import SAVES, VAULT
from ..transfer.download import stream_entry
from ..transfer.receive import expect_descriptor


async def list_namespaces(request: web.Request) -> web.Response:
    """Namespaces the token may read, with their checkpoint count and newest checkpoint."""
    vault = request.app[VAULT]
    who = principal(request)
    out = []
    for rec, latest in await run(request, vault.namespaces):
        if who.may("read", rec.name):
            entry = NamespaceEntry(
                rec.name, rec.checkpoints, latest, rec.logical_bytes, rec.chunking().to_wire()
            )
            out.append(entry.to_wire())
    return json_response({"namespaces": out})


async def list_checkpoints(request: web.Request) -> web.Response:
    """Live checkpoints newest first; `next` is the `before` cursor of the next page;
    `durable=true`: only checkpoints whose `durable` is true."""
    ns = request.match_info["ns"]
    require(request, "read", ns)
    q = request.query
    records, cursor = await run(
        request,
        request.app[VAULT].checkpoints,
        ns,
        limit=query_int(request, "limit", 100),
        before=q.get("before"),
        tag=q.get("tag"),
        validity=q.get("validity"),
        durable=q.get("durable", "false") == "true",
    )
    return json_response(
        {"checkpoints": [r.to_protocol().to_wire() for r in records], "next": cursor}
    )


def save_options(request: web.Request, header: Mapping[str, Any]) -> SaveOptions:
    """A one-request save's options, from its bundle's header (400 for a bad one)."""
    return {
        "parent": parse.parent(header.get("parent")),
        "inherit": bool(header.get("inherit", False)),
        "metadata": parse.metadata(header.get("metadata")),
        "tags": parse.tags(header.get("tags")),
        "chunking": parse.chunking(header.get("chunking")),
        "key": parse.idempotency_key(header.get("key")),
        "by": principal(request).name,
    }


async def save_checkpoint(request: web.Request) -> web.Response:
    """One-request save of a small checkpoint (body: a bundle of header and files)."""
    ns = request.match_info["ns"]
    require(request, "write", ns)
    header, files = await bundle_body(request)
    args = save_options(request, header)
    record, created = await request.app[SAVES].save(request, ns, files, args)
    return json_response(visible_record(request, record).to_wire(), status=201 if created else 200)


async def get_checkpoint(request: web.Request) -> web.Response:
    """One checkpoint by id, `latest` or `latest-valid`."""
    ns, ref = request.match_info["ns"], request.match_info["ref"]
    require(request, "read", ns)
    durable = request.query.get("durable", "false") == "true"  # skip ones not adopted yet
    return json_response(
        (await run(request, request.app[VAULT].get, ns, ref, durable)).to_protocol().to_wire()
    )


async def get_manifest(request: web.Request) -> web.Response:
    """Every file with its chunk list (id, offset, size), for parallel range reads."""
    ns, ref = request.match_info["ns"], request.match_info["ref"]
    require(request, "read", ns)
    record, files = await run(request, request.app[VAULT].manifest, ns, ref)
    manifest = Manifest(record.id, {name: entry.to_protocol() for name, entry in files.items()})
    return json_response(manifest.to_wire())


async def get_storage(request: web.Request) -> web.Response:
    """How a checkpoint is stored: its chunks' stored bytes against its files' bytes, by
    codec (raw, zstd, grouped, delta) and tier, and the longest delta chain a read decodes."""
    ns, ref = request.match_info["ns"], request.match_info["ref"]
    require(request, "read", ns)
    return json_response((await run(request, request.app[VAULT].storage, ns, ref)).to_wire())


async def get_file(request: web.Request) -> web.StreamResponse:
    """A file's bytes, streamed; supports Range (206) and If-None-Match; ETag = file hash."""
    ns = request.match_info["ns"]
    require(request, "read", ns)
    ref, name = request.match_info["ref"], request.match_info["name"]
    # one read of the record (and its files) for both ways of serving it
    rec, files = await run(request, request.app[VAULT].manifest, ns, ref)
    proxied = await proxy_file(request, rec, name)  # not adopted yet: from its part's node
    return proxied or await stream_entry(request, rec, files, name)


async def get_lineage(request: web.Request) -> web.Response:
    """From this checkpoint back to its root; deleted ancestors appear as tombstones."""
    ns, ref = request.match_info["ns"], request.match_info["ref"]
    require(request, "read", ns)
    chain = await run(request, request.app[VAULT].lineage, ns, ref)
    who = principal(request)
    shown = []
    for rec in chain:  # stop at the first namespace the caller may not read: the last
        if not who.may("read", rec.namespace):  # shown entry's `parent` is then an opaque
            break  # reference (a fork's source elsewhere); its record stays 403
        shown.append(rec.to_protocol().to_wire())
    return json_response({"chain": shown})


async def patch_checkpoint(request: web.Request) -> web.Response:
    """Set validity, pinned or tags. Unpinning needs the delete scope: it enables deletion;
    without it the token is append-only (vault/lifecycle.py: own checkpoints, add tags)."""
    ns, cid = request.match_info["ns"], request.match_info["ref"]
    body = await json_body(request)
    require(request, "delete" if body.get("pinned") is False else "write", ns)
    who = principal(request)
    record = await run(
        request,
        request.app[VAULT].lifecycle.patch,
        ns,
        cid,
        validity=parse.validity(body.get("validity")),
        pinned=parse.pinned(body.get("pinned")),
        tags=parse.tags(body.get("tags")),
        by=who.name,
        append_only=not who.may("delete", ns),
    )
    return json_response(visible_record(request, record).to_wire())


async def delete_checkpoint(request: web.Request) -> web.Response:
    """Delete a checkpoint (not pinned); a tombstone keeps its place in lineage."""
    ns, cid = request.match_info["ns"], request.match_info["ref"]
    require(request, "delete", ns)
    await run(request, request.app[VAULT].lifecycle.delete, ns, cid)
    return web.Response(status=204)


async def delete_checkpoints(request: web.Request) -> web.Response:
    """Delete many checkpoints of a namespace in one request: body `{"ids": [...]}`, or
    `{"all": true}` for all of them. Pinned ones are kept and listed; unknown or deleted ids
    are listed as not found. Answers `{"deleted", "pinned", "not_found"}`."""
    ns = request.match_info["ns"]
    require(request, "delete", ns)
    body = await json_body(request)
    ids = parse.bulk_delete(body)
    done = await run(request, request.app[VAULT].delete_many, ns, ids)
    answer = BulkDeleted(done.deleted, done.pinned, done.not_found)
    request[BULK_DELETED] = answer  # the audit log lists what was deleted (api/audit.py)
    return json_response(answer.to_wire())


async def fork_checkpoint(request: web.Request) -> web.Response:
    """A new checkpoint in the target namespace with the same files; no bytes copied."""
    ns, ref = request.match_info["ns"], request.match_info["ref"]
    body = await json_body(request)
    target = body.get("namespace")
    require(request, "read", ns)
    require(request, "write", target if isinstance(target, str) else "")
    record = await run(
        request,
        request.app[VAULT].lifecycle.fork,
        ns,
        ref,
        parse.namespace(target),
        parse.metadata(body.get("metadata")),
        parse.tags(body.get("tags")),
        by=principal(request).name,
    )
    return json_response(record.to_protocol().to_wire(), status=201)


def add_routes(app: web.Application, ns: str) -> None:
    base = f"/v1/namespaces/{ns}/checkpoints"
    app.router.add_get("/v1/namespaces", list_namespaces)
    app.router.add_get(base, list_checkpoints)
    app.router.add_post(base, save_checkpoint)
    app.router.add_delete(base, delete_checkpoints)
    app.router.add_get(base + "/{ref}", get_checkpoint)
    app.router.add_get(base + "/{ref}/manifest", get_manifest)
    app.router.add_get(base + "/{ref}/storage", get_storage)
    app.router.add_get(base + "/{ref}/files/{name:.+}", get_file, expect_handler=expect_descriptor)
    app.router.add_get(base + "/{ref}/lineage", get_lineage)
    app.router.add_patch(base + "/{ref}", patch_checkpoint)
    app.router.add_delete(base + "/{ref}", delete_checkpoint)
    app.router.add_post(base + "/{ref}/fork", fork_checkpoint)
