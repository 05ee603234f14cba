"""The whole cluster from any process: the answers that describe the vault, not one
namespace, gathered from every shard's owner and merged.

- `GET /v1/namespaces`: every shard's namespaces, by name.
- `GET /v1/stats` (and its `namespaces=true` usage): the shards' sums; the role,
  replication and standby stay the answering process's own, and each quota is the
  answering shard's (quotas are enforced per shard: docs/DESIGN.md, "A cluster").
- `GET /v1/stats/history`: one series of the shards' summed samples (the console's
  storage chart), each shard counted at its newest sample at or before each moment.
- `PUT /v1/policy/default`: applied here, then on every other shard's owner, so the
  default is the cluster's; refused (503) before anything changes while a shard has no
  live owner.

A process that does not own its shard (a standby, or one released by a move) holds a copy
of what its shard's owner holds: it asks that owner too and adds nothing of its own, and
a default policy it is sent goes to every owner (the standbys get it with the replica).

Each other owner is asked with the caller's token and `X-Ckpt-Forwarded`, which gets one
process's own answer. Shards share no chunks, so a sum counts no chunk twice. While a shard
has no live owner the answer is 503: a total that silently missed a shard would read as
data gone.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import fields, replace
from typing import Any, TypeVar

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler

from checkpoint_vault.cluster import ClusterNode, Member, NotOwner
from checkpoint_vault.protocol import (
    CodecShare,
    DiskSpace,
    NamespaceBytes,
    StatsReport,
    StorageSample,
    TierTotals,
)

from ..auth import require_admin
from ..http import JSON_BODY, json_body, json_response
from .forward import FORWARDED, SESSION

C = TypeVar("C", TierTotals, CodecShare, DiskSpace)  # records of counters only
Gathered = Callable[[web.Request, Handler, ClusterNode], Awaitable[web.StreamResponse]]


def owners(node: ClusterNode) -> list[tuple[int, Member]]:
    """Every shard this process does not own and its live owner; `NotOwner` while one has
    none (also the S3 endpoint's ListBuckets, api/s3/cluster.py)."""
    out = []
    for shard in range(node.config.shards):
        if shard == node.shard and node.owns():
            continue
        out.append((shard, node.live_owner(shard)))
    return out


def _owners(request: web.Request, node: ClusterNode) -> list[tuple[int, str]]:
    """Every other shard and its live owner's URL."""
    return [(shard, owner.url.rstrip("/")) for shard, owner in owners(node)]


async def _ask(
    request: web.Request, urls: list[tuple[int, str]], method: str = "GET", body: Any = None
) -> list[Any]:
    """Each owner's JSON answer to this request's path and query (or `body`)."""
    headers = {"Authorization": request.headers.get("Authorization", ""), FORWARDED: "1"}
    out = []
    for _, url in urls:
        try:
            async with request.app[SESSION].request(
                method, url + request.path_qs, headers=headers, json=body
            ) as r:
                if r.status != 200:
                    raise NotOwner(f"the shard owner at {url} answered {r.status}; retry shortly")
                out.append(await r.json())
        except aiohttp.ClientError:
            raise NotOwner(f"the shard owner at {url} did not answer; retry shortly") from None
    return out


def _local(response: web.StreamResponse) -> Any | None:
    """This process's own JSON answer, or None when it is not a 200 to merge. A streamed
    answer is another process's: a worker's request forwarded to its writing process
    (node/forward.py), which gathered the whole itself; passed on as it is."""
    if not isinstance(response, web.Response) or response.status != 200:
        return None
    assert response.body is not None
    return json.loads(bytes(response.body))  # type: ignore[arg-type]


async def all_namespaces(
    request: web.Request, handler: Handler, node: ClusterNode
) -> web.StreamResponse:
    local = await handler(request)  # first: a refused caller learns nothing of shards
    mine = _local(local)
    if mine is None:
        return local
    urls = _owners(request, node)
    merged = list(mine["namespaces"]) if node.owns() else []
    for other in await _ask(request, urls):
        merged += other["namespaces"]
    merged.sort(key=lambda n: str(n["name"]))
    return json_response({"namespaces": merged})


async def stats(request: web.Request, handler: Handler, node: ClusterNode) -> web.StreamResponse:
    local = await handler(request)  # first: a refused caller learns nothing of shards
    mine = _local(local)
    if mine is None:
        return local
    urls = _owners(request, node)
    answers = await _ask(request, urls)
    others = [(k, StatsReport.from_wire(o)) for (k, _), o in zip(urls, answers, strict=True)]
    here = StatsReport.from_wire(mine)
    if node.owns():
        return json_response(merge_stats((node.shard, here), others).to_wire())
    # a standby's or a released process's data is a copy of its shard's owner's, asked
    # above: only its role, replication and standby are its own
    whole = merge_stats(others[0], others[1:])
    return json_response(
        replace(whole, role=here.role, replication=here.replication, standby=here.standby).to_wire()
    )


async def history(request: web.Request, handler: Handler, node: ClusterNode) -> web.StreamResponse:
    local = await handler(request)  # first: a refused caller learns nothing of shards
    mine = _local(local)
    if mine is None:
        return local
    urls = _owners(request, node)
    answers = [mine] if node.owns() else []  # else its shard's owner's is among the others
    series = [
        [StorageSample.from_wire(x) for x in answer["samples"]]
        for answer in [*answers, *await _ask(request, urls)]
    ]
    limit = int(request.query.get("limit", "1000"))  # the handler has checked it
    samples = [x.to_wire() for x in merge_samples(series)[-limit:]]
    return json_response({"samples": samples, "interval": mine["interval"]})


async def default_policy(
    request: web.Request, handler: Handler, node: ClusterNode
) -> web.StreamResponse:
    urls = _owners(request, node)  # before the change: none, rather than some shards'
    if not node.owns():  # a standby's or a released process's policy is its owner's
        require_admin(request)
        answers = await _ask(request, urls, "PUT", await json_body(request))
        return json_response(answers[[k for k, _ in urls].index(node.shard)])
    local = await handler(request)
    if _local(local) is None:
        return local
    await _ask(request, urls, "PUT", request.get(JSON_BODY, {}))
    return local


GATHERED: dict[tuple[str, str], Gathered] = {
    ("GET", "/v1/namespaces"): all_namespaces,
    ("GET", "/v1/stats"): stats,
    ("GET", "/v1/stats/history"): history,
    ("PUT", "/v1/policy/default"): default_policy,
}


def _sum(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b


def _by_key(a: dict[str, C], b: dict[str, C]) -> dict[str, C]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _record_sum(out[k], v) if k in out else v
    return out


def _record_sum(a: C, b: C) -> C:
    """Two records of counters as one (TierTotals, CodecShare, DiskSpace)."""
    return replace(a, **{f.name: getattr(a, f.name) + getattr(b, f.name) for f in fields(a)})


def merge_stats(
    mine: tuple[int, StatsReport], others: list[tuple[int, StatsReport]]
) -> StatsReport:
    """`GET /v1/stats` of the whole: the sums, the dedup ratio of the sums, every shard's
    namespaces' usage (each namespace is on one shard), every shard's quotas (each
    enforced by its shard); the rest (role, replication, standby) is this process's."""
    out = mine[1]
    quotas = [replace(q, shard=k) for k, report in [mine, *others] for q in report.quotas]
    for _, o in others:
        by_ns = None if out.by_namespace is None else {**out.by_namespace, **(o.by_namespace or {})}
        out = replace(
            out,
            logical_bytes=out.logical_bytes + o.logical_bytes,
            stored_bytes=out.stored_bytes + o.stored_bytes,
            chunks=out.chunks + o.chunks,
            checkpoints=out.checkpoints + o.checkpoints,
            namespaces=out.namespaces + o.namespaces,
            map_size=out.map_size + o.map_size,
            tiers=_by_key(out.tiers, o.tiers),
            codecs=_by_key(out.codecs, o.codecs),
            disk_bytes=_sum(out.disk_bytes, o.disk_bytes),
            reclaimable_bytes=_sum(out.reclaimable_bytes, o.reclaimable_bytes),
            environments=None
            if out.environments is None or o.environments is None
            else _by_key(out.environments, o.environments),
            by_namespace=None if by_ns is None else dict(sorted(by_ns.items())),
        )
    stored = out.stored_bytes
    ratio = round(out.logical_bytes / stored, 4) if stored else None
    return replace(out, dedup_ratio=ratio, quotas=sorted(quotas, key=lambda q: (q.glob, q.shard)))


def merge_samples(series: list[list[StorageSample]]) -> list[StorageSample]:
    """The shards' sample series (each oldest first) as one: at each moment a shard took a
    sample, the sum of every shard's newest sample then, from the moment every shard with
    samples has one. Shards sample on their own schedules; a step between two of a
    shard's samples is how its figures stood."""
    series = [s for s in series if s]
    if not series:
        return []
    start = max(s[0].at for s in series)
    moments = sorted({x.at for s in series for x in s if x.at >= start})
    at_index = [0] * len(series)  # each series' newest sample at or before the moment
    out = []
    for at in moments:
        for i, s in enumerate(series):
            while at_index[i] + 1 < len(s) and s[at_index[i] + 1].at <= at:
                at_index[i] += 1
        newest = [s[i] for s, i in zip(series, at_index, strict=True)]
        namespaces: dict[str, NamespaceBytes] = {}
        for x in newest:
            namespaces.update(x.namespaces)
        out.append(
            StorageSample(
                at=at,
                logical_bytes=_sum_all(x.logical_bytes for x in newest),
                stored_bytes=_sum_all(x.stored_bytes for x in newest),
                disk_bytes=_sum_all(x.disk_bytes for x in newest),
                namespaces=dict(sorted(namespaces.items())),
            )
        )
    return out


def _sum_all(values: Iterable[int | None]) -> int | None:
    total = 0
    for v in values:
        if v is None:
            return None
        total += v
    return total
