"""Parts across nodes: the part node's shipping and expiry, and the owner's gathering.

On the node that holds parts (vault/parts.py): `Shipper` starts shipping a part to the
shared tier as soon as it is committed, on the worker pool, one run per part at a time; a
`POST /v1/parts/{id}/ship` waits for that run (or starts one: a node restarted since has
none). `parts_context` expires parts past their TTL on a timer.

On the namespace's owner: `gather` fetches each part's manifest from its node (node to
node, with the caller's own token), asks the nodes whose parts are not shipped yet to
finish, bounded by `ship_timeout`, and answers the manifests. Only live members of the
cluster are asked (a caller cannot point the owner at any URL); a part on this very
process is read from its engine. A node that does not answer is `PartUnavailable` (503),
one that no longer holds the part `PartGone` (409); in both cases nothing was committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from checkpoint_vault.protocol import PartRecord
from checkpoint_vault.vault import InvalidRequest
from checkpoint_vault.vault.errors import PartGone, PartUnavailable
from checkpoint_vault.vault.parts import PartManifest

from ..keys import ROLE, RUNTIME, VAULT
from .context import CLUSTER
from .forward import SESSION

log = logging.getLogger("ckpt.parts")

SHIP_TIMEOUT = 600.0  # seconds an owner waits by default for the part nodes to ship
FETCH_TIMEOUT = 30.0  # seconds for a manifest or a release from a part node
MAX_PARTS = 4096  # parts in one commit: a rank each, on the largest jobs
# Seconds between expiry passes: one read of the parts' records (few: one per rank of the
# saves in flight), so a part asked to live a few seconds goes within one more.
EXPIRE_EVERY = 1.0


@dataclass(frozen=True)
class PartRef:
    """A part as a commit names it: the node that holds it ("": this process) and its id."""

    node: str
    id: str


def part_refs(value: Any) -> list[PartRef]:
    if not isinstance(value, list) or not 0 < len(value) <= MAX_PARTS:
        raise InvalidRequest(f"parts must be a list of 1 to {MAX_PARTS} {{node, id}} objects")
    out = []
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            raise InvalidRequest("each part must be an object with an id and a node URL")
        node = item.get("node") or ""
        if not isinstance(node, str):
            raise InvalidRequest("a part's node must be a URL")
        out.append(PartRef(node.rstrip("/"), item["id"]))
    return out


class Shipper:
    """One shipping run per part at a time, on the worker pool."""

    def __init__(self, start: Callable[[str], Awaitable[PartManifest]]) -> None:
        self._start = start
        self._runs: dict[str, asyncio.Future[PartManifest]] = {}

    def ship(self, part_id: str) -> asyncio.Future[PartManifest]:
        run = self._runs.get(part_id)
        if run is None:
            run = asyncio.ensure_future(self._start(part_id))
            self._runs[part_id] = run
            run.add_done_callback(lambda f: self._done(part_id, f))
        return run

    def _done(self, part_id: str, run: asyncio.Future[PartManifest]) -> None:
        self._runs.pop(part_id, None)
        if not run.cancelled() and run.exception() is not None:
            log.warning("shipping part %s failed: %s", part_id, run.exception())

    async def close(self) -> None:
        runs = list(self._runs.values())
        for run in runs:
            run.cancel()
        await asyncio.gather(*runs, return_exceptions=True)


SHIPPER = web.AppKey("parts_shipper", Shipper)
RELEASING = web.AppKey("parts_releasing", set)  # release tasks in flight (kept referenced)


async def parts_context(app: web.Application) -> AsyncIterator[None]:
    vault = app[VAULT]
    loop = asyncio.get_running_loop()

    async def ship(part_id: str) -> PartManifest:
        return await loop.run_in_executor(app[RUNTIME].io, vault.parts.ship, part_id)

    app[SHIPPER] = Shipper(ship)
    app[RELEASING] = set()
    from .durable import TOKENS, adopting, shipping  # it imports this module

    app[TOKENS] = {}

    async def expiring() -> None:
        while True:
            await asyncio.sleep(EXPIRE_EVERY)  # the pass's period, not a wait on work
            try:
                if await loop.run_in_executor(app[RUNTIME].io, vault.parts.expire):
                    log.info("expired parts held past %.0f s", vault.parts.ttl)
                await shipping(app)
            except Exception:  # a pass that failed (a tier down): the next one tries again
                log.exception("expiring parts failed")

    loops = () if app[ROLE].reader else (expiring(), adopting(app))
    tasks = [asyncio.create_task(t) for t in loops]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await app[SHIPPER].close()
        await asyncio.gather(*app[RELEASING], return_exceptions=True)


def own_url(app: web.Application) -> str:
    """This process's URL in the cluster ("" outside one): what a part answers as its node."""
    node = app.get(CLUSTER)
    return node.config.url.rstrip("/") if node is not None else ""


def _live_urls(app: web.Application) -> set[str]:
    node = app.get(CLUSTER)
    if node is None:
        return set()
    return {m.url.rstrip("/") for m, live, _ in node.roster.members() if live}


async def _call(
    request: web.Request, ref: PartRef, method: str, suffix: str, timeout: float
) -> dict[str, Any]:
    """One request to a part's node with the caller's token; its errors as ours."""
    session = request.app[SESSION]
    url = f"{ref.node}/v1/parts/{ref.id}{suffix}"
    headers = {"Authorization": request.headers.get("Authorization", "")}
    try:
        async with session.request(
            method, url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as answer:
            raw = await answer.read()
            status = answer.status
    except (aiohttp.ClientError, TimeoutError) as e:
        raise PartUnavailable(
            f"part {ref.id}'s node {ref.node} did not answer ({type(e).__name__})"
        ) from None
    body = _json(raw)
    if status in (200, 201, 204):
        return body
    found = body.get("error")
    err: dict[str, Any] = found if isinstance(found, dict) else {}
    if status in (404, 409, 410):
        raise PartGone(f"part {ref.id} on {ref.node}: {err.get('message', status)}")
    raise PartUnavailable(f"part {ref.id}'s node {ref.node} answered {status} {err.get('code')}")


def _json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


async def gather(
    request: web.Request, refs: Iterable[PartRef], ship_timeout: float, wait: bool = True
) -> list[PartManifest]:
    """Every part's manifest, each shipped to the shared tier unless held here; `wait`
    False: each claimed instead (held until released), shipped later."""
    refs = list(refs)
    here, live = own_url(request.app), _live_urls(request.app)
    for ref in refs:
        if ref.node not in ("", here) and request.app.get(CLUSTER) is None:
            raise PartGone(f"part {ref.id}: outside a cluster only this server holds parts")
        if ref.node not in ("", here) and ref.node not in live:
            raise PartUnavailable(f"part {ref.id}: {ref.node or '?'} is not a live cluster node")
    return list(await asyncio.gather(*(_one(request, r, here, ship_timeout, wait) for r in refs)))


async def _one(
    request: web.Request, ref: PartRef, here: str, ship_timeout: float, wait: bool
) -> PartManifest:
    vault = request.app[VAULT]
    loop = asyncio.get_running_loop()
    if ref.node in ("", here):  # held by this process: adopted without shipping
        read = vault.parts.manifest if wait else vault.parts.claim
        return await loop.run_in_executor(request.app[RUNTIME].io, read, ref.id)
    if not wait:
        part = _manifest(await _call(request, ref, "POST", "/claim", FETCH_TIMEOUT))
        if part.id != ref.id:
            raise PartUnavailable(f"part {ref.id}'s node answered another part")
        return part
    part = _manifest(await _call(request, ref, "GET", "", FETCH_TIMEOUT))
    if part.id != ref.id:
        raise PartUnavailable(f"part {ref.id}'s node answered another part")
    if not part.shipped:
        part = _manifest(await _call(request, ref, "POST", "/ship", ship_timeout))
    return part


def _manifest(body: dict[str, Any]) -> PartManifest:
    try:
        record = PartRecord.from_wire(body)
    except ValueError as e:
        raise PartUnavailable(f"a part node answered a malformed manifest ({e})") from None
    return PartManifest.from_record(record)


def unclaim_unless_committed(
    request: web.Request, ns: str, by: str | None, refs: list[PartRef]
) -> None:
    """After a commit not waiting for shipping failed: give the parts it claimed back to
    their own deadlines, unless its checkpoint was made all the same (its transaction
    done, the answer lost), behind the answer."""
    app = request.app
    here = own_url(app)
    vault = app[VAULT]
    loop = asyncio.get_running_loop()
    io = app[RUNTIME].io
    named = [(r.node, r.id) for r in refs]

    async def undo() -> None:
        if await loop.run_in_executor(io, vault.parts.replayed, ns, by, named) is not None:
            return
        for ref in refs:
            try:
                if ref.node in ("", here):
                    await loop.run_in_executor(io, vault.parts.unclaim, ref.id)
                else:
                    await _call(request, ref, "DELETE", "/claim", FETCH_TIMEOUT)
            except Exception as e:  # its claim ends it
                log.info("unclaiming part %s on %s: %s", ref.id, ref.node or "here", e)

    task = asyncio.ensure_future(undo())
    app[RELEASING].add(task)
    task.add_done_callback(app[RELEASING].discard)


def release(request: web.Request, refs: Iterable[PartRef]) -> None:
    """Let the part nodes delete the adopted parts, behind the answer: a release that
    fails leaves the part to its TTL."""
    app = request.app
    here = own_url(app)
    vault = app[VAULT]
    loop = asyncio.get_running_loop()

    async def one(ref: PartRef) -> None:
        try:
            if ref.node in ("", here):
                await loop.run_in_executor(app[RUNTIME].io, vault.parts.release, ref.id)
            else:
                await _call(request, ref, "DELETE", "", FETCH_TIMEOUT)
        except Exception as e:  # the TTL collects it
            log.info("releasing part %s on %s: %s", ref.id, ref.node or "here", e)

    for ref in refs:
        task = asyncio.ensure_future(one(ref))
        app[RELEASING].add(task)
        task.add_done_callback(app[RELEASING].discard)
