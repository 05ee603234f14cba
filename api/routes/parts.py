"""Routes of a checkpoint written on many hosts and committed once (vault/parts.py).

On a node near the writer: `POST /v1/parts` opens a part's upload (filled with the upload
routes, descriptors handed over included), `POST /v1/uploads/{id}/part` commits it as a
part and starts shipping it; `GET`, `POST .../ship` and `DELETE /v1/parts/{id}` are how an
owner reads, completes and releases it. On the namespace's owner (any node forwards it
there): `POST /v1/namespaces/{ns}/parts` commits every part as one checkpoint.
Whatever token may write the namespace may save and commit its parts.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from checkpoint_vault.protocol import PartSaved, UploadOpened
from checkpoint_vault.vault import InvalidRequest
from checkpoint_vault.vault.clock import rfc3339
from checkpoint_vault.vault.names import PARTS
from checkpoint_vault.vault.parts import PartManifest, PartsCommit

from .. import parse
from ..auth import principal, require, require_admin, visible_record
from ..cluster.durable import TOKENS
from ..cluster.parts import (
    SHIP_TIMEOUT,
    SHIPPER,
    gather,
    own_url,
    part_refs,
    release,
    unclaim_unless_committed,
)
from ..http import json_body, json_response, large_json_response, run
from ..keys import VAULT
from ..transfer.download import stream_file
from .uploads import upload_session

log = logging.getLogger("ckpt.parts")


async def open_part(request: web.Request) -> web.Response:
    """Open an upload on this node that becomes a part of a checkpoint of `namespace`."""
    body = await json_body(request)
    ns = body.get("namespace")
    if not isinstance(ns, str):
        raise InvalidRequest("namespace is required: the namespace the part is for")
    require(request, "write", ns)
    ttl = body.get("ttl")
    if ttl is not None and (not isinstance(ttl, (int, float)) or isinstance(ttl, bool)):
        raise InvalidRequest("ttl must be a number of seconds")
    vault = request.app[VAULT]
    session, profile = await run(request, vault.parts.open, ns, principal(request).name, ttl)
    opened = UploadOpened(session.id, ns, None, rfc3339(session.expires_at), profile.to_wire())
    return json_response(opened.to_wire(), status=201)


def _saved(request: web.Request, part: PartManifest) -> PartSaved:
    """What a writer keeps of a part to name it in a commit."""
    return PartSaved(
        own_url(request.app),
        part.id,
        part.namespace,
        part.size,
        sorted(part.files),
        rfc3339(part.expires_at),
        part.shipped,
    )


async def commit_part(request: web.Request) -> web.Response:
    """Commit a part's upload; its shipping to the shared tier starts at once."""
    vault = request.app[VAULT]
    session = await upload_session(request)
    body = await json_body(request)
    files = parse.commit_files(body.get("files"))
    part = await run(request, vault.parts.commit, session.id, files, principal(request).domain())
    if vault.store.shared is not None and not vault.store.config.part_ship_delay:
        request.app[SHIPPER].ship(part.id)  # behind the answer; the owner waits for it
    return json_response(_saved(request, part).to_wire(), status=201)


async def _part(request: web.Request) -> PartManifest:
    part = await run(request, request.app[VAULT].parts.manifest, request.match_info["part"])
    require(request, "write", part.namespace)
    return part


async def list_parts(request: web.Request) -> web.Response:
    """Admin: the parts this node holds, expired ones until the next expiry pass."""
    require_admin(request)
    held = await run(request, request.app[VAULT].parts.held)
    return json_response({"parts": [_saved(request, p).to_wire() for p in held]})


async def get_part(request: web.Request) -> web.Response:
    """A part's manifest, for the owner that commits it."""
    part = await _part(request)
    return await large_json_response(request, part.to_record().to_wire())


async def ship_part(request: web.Request) -> web.Response:
    """Wait until the part is in the shared tier (the run its commit started, or a new
    one); answers its manifest."""
    part = await _part(request)
    if not part.shipped:
        part = await asyncio.shield(request.app[SHIPPER].ship(part.id))
    return await large_json_response(request, part.to_record().to_wire())


async def claim_part(request: web.Request) -> web.Response:
    """Hold a part until released: a checkpoint committed before shipping names it."""
    part = await _part(request)
    part = await run(request, request.app[VAULT].parts.claim, part.id)
    return await large_json_response(request, part.to_record().to_wire())


async def get_part_file(request: web.Request) -> web.StreamResponse:
    """A file of a part, for the owner serving a checkpoint not adopted yet (read scope
    of the namespace the part is for)."""
    part = await run(request, request.app[VAULT].parts.manifest, request.match_info["part"])
    require(request, "read", part.namespace)
    return await stream_file(request, PARTS, part.id, request.match_info["name"])


async def unclaim_part(request: web.Request) -> web.Response:
    """Back to its own deadline: the commit that claimed it made nothing."""
    part = await _part(request)
    await run(request, request.app[VAULT].parts.unclaim, part.id)
    return web.Response(status=204)


async def release_part(request: web.Request) -> web.Response:
    """Delete a part: its owner adopted it (or gave it up)."""
    part = await _part(request)
    await run(request, request.app[VAULT].parts.release, part.id)
    return web.Response(status=204)


async def commit_parts(request: web.Request) -> web.Response:
    """One checkpoint of every part named, on this namespace's owner: visible all or
    nothing; a part that cannot be had fails it (503 part_unavailable, 409 part_gone). A
    retry of a commit that was made answers its checkpoint (200), whatever the parts."""
    ns = request.match_info["ns"]
    require(request, "write", ns)
    body = await json_body(request)
    refs = part_refs(body.get("parts"))
    ship_timeout = body.get("ship_timeout", SHIP_TIMEOUT)
    if not isinstance(ship_timeout, (int, float)) or not 0 < ship_timeout <= 3600:
        raise InvalidRequest("ship_timeout must be a number of seconds in (0, 3600]")
    wait_durable = body.get("wait_durable", False)
    if not isinstance(wait_durable, bool):
        raise InvalidRequest("wait_durable must be true or false")
    by = principal(request).name
    named = [(r.node, r.id) for r in refs]
    vault = request.app[VAULT]
    done = await run(request, vault.parts.replayed, ns, by, named)
    if done is not None:  # a retry of a commit that was made: its checkpoint, once
        if done.durable:  # in case the first attempt died before it released them
            release(request, refs)
        else:  # an owner restarted since has no token to release them with
            request.app[TOKENS].setdefault(done.id, request.headers.get("Authorization", ""))
        return json_response(visible_record(request, done).to_wire(), status=200)
    started = time.perf_counter()
    try:
        parts = await gather(request, refs, float(ship_timeout), wait_durable)
        gathered = time.perf_counter()
        commit = PartsCommit(
            ns,
            parts,
            by,
            named,
            parent=parse.parent(body.get("parent")),
            metadata=parse.metadata(body.get("metadata")),
            tags=parse.tags(body.get("tags")),
            wait_durable=wait_durable,
        )
        rec = await run(request, vault.parts.commit_parts, commit)
    except BaseException:
        if not wait_durable:  # claims of a commit that made nothing must not hold parts
            unclaim_unless_committed(request, ns, by, refs)
        raise
    log.info(
        "committed %d parts of %s as %s: manifests and shipping %.3f s, adoption and "
        "commit %.3f s",
        len(parts), ns, rec.id, gathered - started, time.perf_counter() - gathered,
    )  # fmt: skip
    if rec.durable:
        release(request, refs)
    else:  # released once adopted (api/cluster/durable.py), with this token
        request.app[TOKENS][rec.id] = request.headers.get("Authorization", "")
    return json_response(visible_record(request, rec).to_wire(), status=201)


def add_routes(app: web.Application, ns: str) -> None:
    app.router.add_post("/v1/parts", open_part)
    app.router.add_post("/v1/uploads/{upload_id}/part", commit_part)
    app.router.add_get("/v1/parts", list_parts)
    app.router.add_get("/v1/parts/{part}", get_part)
    app.router.add_post("/v1/parts/{part}/ship", ship_part)
    app.router.add_delete("/v1/parts/{part}", release_part)
    app.router.add_post("/v1/parts/{part}/claim", claim_part)
    app.router.add_delete("/v1/parts/{part}/claim", unclaim_part)
    app.router.add_get("/v1/parts/{part}/files/{name:.+}", get_part_file)
    app.router.add_post(f"/v1/namespaces/{ns}/parts", commit_parts)
