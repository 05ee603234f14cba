"""The HTTP side of a cluster (cluster/ is the engine side, and speaks no HTTP).

- `cluster_context`: the cluster's objects opened, a first beat before the port opens
  (so a primary holds its lease before it answers), then one beat per interval on a
  thread of its own, and the token table reloaded when another node's tokens arrived.
- `cluster_middleware`: a request whose namespace (or upload id) is another shard's is
  forwarded to that shard's owner (api/cluster/forward.py); one for this process's shard
  it no longer owns is refused 409 (`ClusterConflict`) or, with no owner known, 503;
  one about the whole vault (namespaces, stats, the default policy) is gathered from
  every shard's owner (api/cluster/whole.py).
- `ShardedSink`: a `POST /v1/saves` entry for another shard is answered 503, which the
  client sends again alone on its namespace's own route, where the proxy routes it.

A process that only reads (a worker of `--workers`) does not beat: it refreshes its view
of the members and treats its shard as owned while the members' beats say its writing
process owns it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from checkpoint_vault.cluster import ClusterConflict, ClusterNode, Member, NotOwner, upload_shard
from checkpoint_vault.cluster.node import Local
from checkpoint_vault.tiering import open_tier
from checkpoint_vault.tiering.wrappers import RetryingTier
from checkpoint_vault.vault import Vault, VaultError
from checkpoint_vault.vault.direct import SaveOptions

from ..keys import ROLE, SAVES, SETTINGS, TOKENS, VAULT
from ..saving import PendingSave, Saved, SaveSink
from .forward import FORWARDED, SESSION, forward, new_session
from .whole import GATHERED

log = logging.getLogger("ckpt.cluster")

CLUSTER = web.AppKey("cluster", ClusterNode)


def _local(vault: Vault) -> Local:
    """This process for its beat: role, epoch, lag, and its load from the catalog's
    counters (three reads: no walk of the catalog once a second)."""
    roles = vault.roles
    with vault.store.catalog_env.read() as txn:
        load = [vault.store.counters.get(txn, k) for k in LOAD]
    if roles.standby is not None:
        return Local("standby", None, roles.standby.status().lag_seconds, *load)
    repl = roles.replication
    if repl is None:
        return Local(roles.role, 0, None, *load)
    return Local(roles.role, repl.epoch, repl.status().lag_seconds, *load)


LOAD = ("checkpoints", "logical_bytes", "stored_bytes")


async def cluster_context(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    config = settings.cluster
    if config is None:
        yield
        return
    options = dict(settings.tiers.get(config.tier, {})) if config.tier else {}
    options.pop("url", None)
    tier = RetryingTier(open_tier("cluster", config.store, options))
    vault = app[VAULT]
    writes = not app[ROLE].reader
    node = ClusterNode(config, tier, vault.tokens if writes else None, beats=writes)
    app[CLUSTER] = node
    app[SESSION] = new_session()
    app[SAVES] = ShardedSink(app[SAVES], node)
    pool = ThreadPoolExecutor(1, thread_name_prefix="vault-cluster")
    loop = asyncio.get_running_loop()

    async def beat() -> None:
        if await loop.run_in_executor(pool, node.beat, _local(vault)):
            app[TOKENS].reload(vault.tokens.all())
        if writes and node.takeover_due():
            await loop.run_in_executor(pool, _take_over, vault, node)
            await beat()  # claim the new epoch's lease at once

    async def beating() -> None:
        while True:
            await asyncio.sleep(config.beat_interval)  # the beat's period, not a wait on work
            try:
                await beat()
            except Exception:  # a bug: keep beating, the lease depends on it
                log.exception("cluster beat failed")

    try:
        await beat()
        task = asyncio.create_task(beating())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    finally:
        await app[SESSION].close()
        pool.shutdown(wait=True)


def _take_over(vault: Vault, node: ClusterNode) -> None:
    """Promote this standby: catch up from the replica, claim the replica's next epoch
    (fencing the old primary), take writes (vault/roles.py). Its lease follows at the
    next beat, then the proxy's check (cluster/proxy.py)."""
    started = time.monotonic()
    log.warning("shard %d has no live owner: taking it over", node.shard)
    try:
        out = vault.roles.promote()
    except VaultError as e:
        log.error("taking shard %d over failed: %s", node.shard, e.message)
        return
    node.takeovers.append(time.monotonic() - started)
    log.warning(
        "took shard %d over at epoch %d in %.2f s", node.shard, out.epoch, node.takeovers[-1]
    )


def _shard(request: web.Request, node: ClusterNode) -> int | None:
    ns = request.match_info.get("ns")
    if ns is not None:
        return node.shard_of(ns)
    upload = request.match_info.get("upload_id")
    if upload is not None:
        return upload_shard(upload)
    return None


def passed_on(request: web.Request) -> bool:
    """Whether `cluster_middleware` will hand this request to another shard's owner, whose
    own authentication charges the token's rate: charged here as well, a request that
    takes a hop would count twice. (Not a header the caller could set: this process's own
    view of the shards decides.)"""
    node = request.app.get(CLUSTER)
    if node is None:
        return False
    shard = _shard(request, node)
    return shard is not None and not (shard == node.shard and node.owns())


def cluster_middleware() -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        node = request.app.get(CLUSTER)
        gathered = None if node is None else GATHERED.get((request.method, request.path))
        if gathered is not None and node is not None and FORWARDED not in request.headers:
            return await gathered(request, handler, node)  # api/cluster/whole.py
        shard = None if node is None else _shard(request, node)
        if node is None or shard is None:
            return await handler(request)
        owner = owner_for(request, node, shard)
        if owner is None:
            return await handler(request)
        return await forward(request, request.app[SESSION], owner.url, node.config.node)

    return middleware


def owner_for(request: web.Request, node: ClusterNode, shard: int) -> Member | None:
    """Where a request for `shard` goes: None when this process serves it, else the live
    owner to forward it to (counted). Refused instead: a write to the shard this process
    lost (`ClusterConflict`), or no live owner, or one already forwarded (`NotOwner`)."""
    if shard == node.shard:
        if node.owns():
            return None
        if node.fenced and request.method not in ("GET", "HEAD"):
            raise node.lost or ClusterConflict(
                f"this process lost shard {shard} to a takeover: it takes no writes for it"
            )
    owner = node.live_owner(shard)  # a process that released its shard forwards too
    if FORWARDED in request.headers:
        raise NotOwner(f"shard {shard} moved while this request was forwarded; retry")
    node.forwarded += 1
    return owner


class ShardedSink:
    """`POST /v1/saves` in a cluster: this shard's saves go on, the others are refused
    one by one (503) and sent again alone by the client, to their own routes."""

    def __init__(self, inner: SaveSink, node: ClusterNode) -> None:
        self._inner = inner
        self._node = node

    async def save(
        self, request: web.Request, ns: str, files: dict[str, bytes], options: SaveOptions
    ) -> Saved:
        return await self._inner.save(request, ns, files, options)

    async def save_all(self, request: web.Request, saves: list[PendingSave]) -> None:
        node = self._node
        mine = []
        for save in saves:
            shard = node.shard_of(save.namespace)
            if shard == node.shard and node.owns():
                mine.append(save)
            else:
                save.outcome = NotOwner(
                    f"namespace {save.namespace!r} is on shard {shard}: send it on its own route"
                )
        if mine:
            await self._inner.save_all(request, mine)
