"""The S3 endpoint in a cluster: every bucket served by its shard's owner, from any process.

A bucket is the namespace of its name (naming.py), so its shard is that namespace's,
`crc32(name) mod N`, the rule the proxy applies too (cluster/proxy.py). A request for a
bucket of a shard this process does not own is passed to the owner's endpoint (the URL
its beat names) by the JSON API's forwarder (api/cluster/forward.py: body and answer
streamed, once), with the caller's `Host` and every other header as sent, so the SigV4
signature verifies on the owner. It is forwarded before it is authenticated here: the
owner checks it and charges the token's rate once, and a token this process's mirror
does not hold yet still works. With no live owner (a takeover under way) the answer is
S3's 503 `ServiceUnavailable` with `Retry-After: 2`, which SDKs retry.

ListBuckets asks every other shard's owner the same signed request, marked forwarded
(which gets that process's own buckets), and merges the answers, as api/cluster/whole.py
merges `GET /v1/namespaces`; a process that does not own its shard adds nothing of its
own (its catalog is a copy of its owner's).

The open uploads of the buckets live in the owner's memory (state.py). A process that
starts owning its shard (a standby promoted, at a new replica epoch) finds them again in
its catalog before it serves a bucket or commits an idle one: what it remembered was a
standby's copy.
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from checkpoint_vault.cluster import ClusterNode, NotOwner

from ..cluster import CLUSTER
from ..cluster.context import owner_for
from ..cluster.forward import FORWARDED, SESSION, forward, passed_headers
from ..cluster.whole import owners
from ..keys import CLOCK, RUNTIME, VAULT
from . import xml
from .errors import S3Error
from .keys import MAIN, STATE
from .naming import namespace
from .state import open_uploads


def _node(app: web.Application) -> ClusterNode | None:
    return app[MAIN].get(CLUSTER)


async def routed(request: web.Request, bucket: str) -> web.StreamResponse | None:
    """The owner's answer to a request for another shard's bucket; None when this
    process serves it (its open uploads found again first, if it just took the shard)."""
    node = _node(request.app)
    if node is None or not bucket:
        return None
    try:
        ns = namespace(bucket)
    except S3Error:
        return None  # refused by the handler, here
    shard = node.shard_of(ns)
    owner = owner_for(request, node, shard)
    if owner is None:
        await serving(request.app)
        return None
    if owner.s3_url is None:
        raise NotOwner(f"the owner of shard {shard} runs no S3 endpoint; retry shortly")
    session = request.app[MAIN][SESSION]
    return await forward(request, session, owner.s3_url, node.config.node, keep_host=True)


async def serving(app: web.Application) -> bool:
    """Whether this process serves its shard's buckets now (always, alone); once per
    replica epoch it owns, its open uploads are found again in its catalog first."""
    node = _node(app)
    if node is None:
        return True
    if not node.owns() or node.local is None:
        return False
    state = app[STATE]
    epoch = node.local.epoch
    if state.epoch == epoch:
        return True
    async with state.recovering:  # one request finds them; the others wait for it
        if state.epoch != epoch:
            loop = asyncio.get_running_loop()
            now = app[CLOCK].now()
            found = await loop.run_in_executor(app[RUNTIME].io, open_uploads, app[VAULT], now)
            state.opened.clear()
            state.opened.update(found)
            state.multipart.clear()
            state.epoch = epoch
    return True


async def whole(request: web.Request, mine: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """ListBuckets of the whole cluster: `mine` (this process's buckets the caller may
    read) and every other shard owner's, by name."""
    node = _node(request.app)
    if node is None or FORWARDED in request.headers:
        return mine
    found = list(mine) if node.owns() else []
    session = request.app[MAIN][SESSION]
    headers = passed_headers(request, node.config.node, keep_host=True)
    for shard, owner in owners(node):
        if owner.s3_url is None:
            raise NotOwner(f"the owner of shard {shard} runs no S3 endpoint; retry shortly")
        url = owner.s3_url.rstrip("/") + request.raw_path
        try:
            async with session.get(url, headers=headers) as r:
                if r.status != 200:
                    raise NotOwner(f"the owner of shard {shard} answered {r.status}; retry")
                found += xml.buckets(await r.read())
        except aiohttp.ClientError:
            raise NotOwner(f"the owner of shard {shard} did not answer; retry shortly") from None
    return sorted(found)
