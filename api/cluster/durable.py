"""Checkpoints committed before their parts were shipped (issue 44, M2; vault/durable.py).

On the owner: `adopting` runs every `ADOPT_EVERY` seconds while this process writes, and
adopts each pending checkpoint whose parts the shared index now lists (state in the
catalog: a restart or a takeover carries on). Then the parts are released: one on this
process through its engine, one on another node with the token that committed (kept in
memory only), or, without it (after a restart) or with that node not answering, by a
marker in the cluster's store (cluster/releases.py). `proxy_file` serves a file of a
pending checkpoint from the node of the part that holds it, node to node as the caller
(its token, or an S3 caller's signature: api/cluster/signed.py); a node down answers 503
`part_unavailable`.

On a part's node: `shipping` ships claimed parts not shipped yet (after a restart, or
once `[uploads] part_ship_delay` is over), and releases those its owner marked released.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

import aiohttp
from aiohttp import web
from yarl import URL

from checkpoint_vault.cluster import ClusterNode, releases
from checkpoint_vault.protocol import DESCRIPTOR_TYPE
from checkpoint_vault.vault import Vault
from checkpoint_vault.vault.errors import PartUnavailable
from checkpoint_vault.vault.records import StoredCheckpoint

from ..keys import RUNTIME, VAULT
from .context import CLUSTER
from .forward import SESSION
from .parts import SHIPPER, own_url

log = logging.getLogger("ckpt.parts")

ADOPT_EVERY = 0.5  # seconds between adoption passes (a read of the pending table: few rows)
READ_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=60)
TOKENS = web.AppKey("parts_tokens", dict)  # checkpoint id -> Authorization that committed it
_PASSED = ("Range", "If-None-Match", "If-Range")
Signer = Callable[[str, URL], dict[str, str]]  # (method, url) -> headers asking as the caller


async def adopt_pass(app: web.Application) -> int:
    """Adopt what can be; release the parts of what was adopted. How many were done."""
    vault = app[VAULT]
    loop = asyncio.get_running_loop()
    io = app[RUNTIME].io
    done = 0
    waiting = await loop.run_in_executor(io, vault.parts.durability.waiting)
    shared = vault.store.shared
    if waiting and shared is not None:  # one listing a pass, however many wait
        await loop.run_in_executor(io, shared.refresh)
    for ckpt_id in waiting:
        parts = await loop.run_in_executor(io, vault.parts.durability.adopt, ckpt_id, False)
        if parts is None:
            continue
        done += 1
        log.info("adopted the parts of checkpoint %s: durable", ckpt_id)
        auth = app[TOKENS].pop(ckpt_id, None)
        for node, part_id in parts:
            await _release(app, node, part_id, auth, ckpt_id)
    return done


async def _release(
    app: web.Application, node: str, part_id: str, auth: str | None, ckpt_id: str
) -> None:
    """A part on this process through its engine; on another node with the token that
    committed, or (no token: committed before a restart; that node not answering) a
    marker in the cluster's store, which the part node takes (cluster/releases.py)."""
    loop = asyncio.get_running_loop()
    io = app[RUNTIME].io
    try:
        if node in ("", own_url(app)):
            await loop.run_in_executor(io, app[VAULT].parts.release, part_id)
            return
        if auth is not None and await _ask_release(app, node, part_id, auth):
            return
        await loop.run_in_executor(io, releases.mark, app[CLUSTER].store, node, part_id, ckpt_id)
        log.info("part %s on %s: released by a marker in the store", part_id, node)
    except Exception as e:  # its claim ends it (7 days)
        log.warning("releasing part %s on %s: %s", part_id, node or "here", e)


async def _ask_release(app: web.Application, node: str, part_id: str, auth: str) -> bool:
    """DELETE the part on its node; whether that node answered it is gone."""
    url = f"{node}/v1/parts/{part_id}"
    timeout = aiohttp.ClientTimeout(total=30)
    try:
        async with app[SESSION].delete(
            url, headers={"Authorization": auth}, timeout=timeout
        ) as answer:
            return answer.status in (204, 409)  # 409 part_gone: released already
    except (aiohttp.ClientError, TimeoutError):
        return False


async def adopting(app: web.Application) -> None:
    """Adoption passes while this process owns its shard (outside a cluster: always); a
    standby's catalog is its owner's replica, adopted there. The node is looked up each
    pass: this task starts before cluster_context has made it."""
    while True:
        await asyncio.sleep(ADOPT_EVERY)  # the pass's period, not a wait on work
        node = app.get(CLUSTER)
        if node is not None and not node.owns():
            continue
        try:
            await adopt_pass(app)
        except Exception:  # a tier or the store down: the next pass tries again
            log.exception("adopting parts failed")


async def shipping(app: web.Application) -> None:
    """Ship claimed parts this node holds that are not shipped yet (one pass)."""
    vault = app[VAULT]
    node = app.get(CLUSTER)
    if vault.store.shared is None or (node is not None and not node.owns()):
        return
    loop = asyncio.get_running_loop()
    for part_id in await loop.run_in_executor(app[RUNTIME].io, vault.parts.to_ship):
        app[SHIPPER].ship(part_id)
    if node is not None:
        await loop.run_in_executor(app[RUNTIME].io, _take_releases, vault, node)


def _take_releases(vault: Vault, node: ClusterNode) -> None:
    """Release the claimed parts an owner marked as released in the store (blocking; one
    listing, only while this node holds claimed parts)."""
    if not vault.parts.any_claimed():
        return
    for key, part_id in releases.marked(node.store, node.config.url):
        if vault.parts.release(part_id):
            log.info("released part %s: its owner adopted it (marker in the store)", part_id)
        releases.clear(node.store, key)


async def proxy_file(
    request: web.Request,
    rec: StoredCheckpoint,
    name: str,
    sign: Signer | None = None,
    answer_headers: Mapping[str, str] | None = None,
    app: web.Application | None = None,
) -> web.StreamResponse | None:
    """A file of a pending checkpoint from its part's node; None: serve it here. `sign`:
    how to ask as the caller (default: its own `Authorization`; an S3 caller's request is
    signed with its S3 key, api/cluster/signed.py); `answer_headers` replace the part
    node's (the S3 endpoint's ETag and Last-Modified); `app`: the one holding the vault
    and the cluster's session (the S3 endpoint's own app lends the main app's)."""
    if rec.durable:
        return None
    app = app or request.app
    vault = app[VAULT]
    pending = await asyncio.get_running_loop().run_in_executor(
        app[RUNTIME].io, vault.parts.durability.pending, rec.id
    )
    where = pending.part_of(name) if pending is not None else None
    if where is None or where[0] in ("", own_url(app)):
        return None  # adopted meanwhile, or a part on this process: its chunks are here
    node, part_id = where
    if request.content_type == DESCRIPTOR_TYPE:  # not handed over: HTTP then, proxied
        return web.Response(status=409, text="file not on this node yet")
    url = URL(f"{node}/v1/parts/{part_id}/files/{name}")
    if sign is None:
        headers = {"Authorization": request.headers.get("Authorization", "")}
    else:
        headers = sign(request.method, url)
    headers.update({h: request.headers[h] for h in _PASSED if h in request.headers})
    try:
        async with app[SESSION].request(
            request.method, url, headers=headers, timeout=READ_TIMEOUT
        ) as answer:
            if answer.status >= 400 and answer.status != 416:  # 401: a token not mirrored yet
                raise PartUnavailable(
                    f"file {name!r} is on part {part_id}'s node {node}, which answered "
                    f"{answer.status}; it is read from the owner once adopted"
                )
            out = web.StreamResponse(status=answer.status)
            for h in ("Content-Type", "Content-Length", "Content-Range", "ETag", "Accept-Ranges"):
                if h in answer.headers:
                    out.headers[h] = answer.headers[h]
            out.headers.update(answer_headers or {})
            await out.prepare(request)
            async for block in answer.content.iter_chunked(1 << 20):
                await out.write(block)
            await out.write_eof()
            return out
    except (aiohttp.ClientError, TimeoutError) as e:
        raise PartUnavailable(
            f"file {name!r} is on part {part_id}'s node {node}, which did not answer "
            f"({type(e).__name__}); it is read from the owner once adopted"
        ) from None
