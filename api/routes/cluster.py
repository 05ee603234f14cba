"""`GET /v1/cluster` (admin): the cluster as this process sees it; `GET /v1/cluster/primary`
(no token): 200 only on the process holding its shard's lease, what the proxy checks
(cluster/proxy.py)."""

from __future__ import annotations

from aiohttp import web

from vault import NotFound

from ..auth import require_admin
from ..cluster import CLUSTER
from ..http import json_response
from ..keys import VAULT


async def cluster_state(request: web.Request) -> web.Response:
    """Nodes (up or down), every process's role, epoch and beat, each shard's owner and
    replica lag, as this process last read them from the store (one beat ago at most)."""
    require_admin(request)
    node = request.app.get(CLUSTER)
    if node is None:
        raise NotFound("this server is not part of a cluster (no [cluster] section)")
    return json_response(node.status())


async def primary(request: web.Request) -> web.Response:
    """200 while this process writes its shard (a single server: while it is the primary),
    else 503: the proxy sends a shard's requests to the one server that answers 200."""
    node = request.app.get(CLUSTER)
    owner = request.app[VAULT].roles.role == "primary" if node is None else node.owns()
    return json_response({"primary": owner}, status=200 if owner else 503)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/cluster", cluster_state)
    app.router.add_get("/v1/cluster/primary", primary)
