"""`GET /v1/cluster` (admin): the cluster as this process sees it; `GET /v1/cluster/primary`
(no token): 200 only on the process holding its shard's lease, what the proxy checks
(cluster/proxy.py)."""

from __future__ import annotations

from aiohttp import web

from checkpoint_vault.cluster import NotOwner
from checkpoint_vault.vault import InvalidRequest, NotFound, Unavailable

from ..auth import require_admin
from ..cluster import CLUSTER
from ..http import json_body, json_response, run
from ..keys import VAULT


async def cluster_state(request: web.Request) -> web.Response:
    """Nodes (up or down), every process's role, epoch and beat, each shard's owner and
    replica lag, as this process last read them from the store (one beat ago at most);
    `{"cluster": false}` from a server that is not part of one."""
    require_admin(request)
    node = request.app.get(CLUSTER)
    if node is None:  # asked by the console's Operations view of every server
        return json_response({"cluster": False})
    return json_response({"cluster": True, **node.status()})


async def primary(request: web.Request) -> web.Response:
    """200 while this process writes its shard (a single server: while it is the primary),
    else 503: the proxy sends a shard's requests to the one server that answers 200."""
    node = request.app.get(CLUSTER)
    owner = request.app[VAULT].roles.role == "primary" if node is None else node.owns()
    return json_response({"primary": owner}, status=200 if owner else 503)


async def release(request: web.Request) -> web.Response:
    """`{"shard": k}`: hand this process's shard over to a standby about to be promoted
    (`ckpt cluster move`): from now on its requests are answered 503 (retried by clients)
    and, once the new owner holds the lease, forwarded there; answers when the replica has
    every write this process acknowledged. `{"shard": k, "cancel": true}`: take writes
    again (the promotion failed), unless another process took the shard meanwhile."""
    require_admin(request)
    node = request.app.get(CLUSTER)
    if node is None:
        raise NotFound("this server is not part of a cluster (no [cluster] section)")
    body = await json_body(request)
    shard = body.get("shard")
    if shard != node.shard:
        raise InvalidRequest(f"this process serves shard {node.shard}, not {shard!r}")
    vault = request.app[VAULT]
    if body.get("cancel"):
        if node.lost is None:
            node.released = False
            vault.roles.step_up()
        return json_response({"shard": node.shard, "released": node.released})
    if not node.owns():
        raise NotOwner(f"this process does not own shard {node.shard} now")
    node.released = True

    def refused() -> Exception:
        return NotOwner(f"shard {node.shard} is moving to another node; retry shortly")

    caught_up = await run(request, vault.roles.step_down, refused, RELEASE_TIMEOUT)
    if not caught_up:
        node.released = False
        vault.roles.step_up()
        raise Unavailable(f"the replica did not catch up within {RELEASE_TIMEOUT} s: not moved")
    epoch = node.local.epoch if node.local is not None else None
    return json_response({"shard": node.shard, "released": True, "epoch": epoch})


RELEASE_TIMEOUT = 30.0  # seconds for the replica to take what was acknowledged


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/cluster", cluster_state)
    app.router.add_get("/v1/cluster/primary", primary)
    app.router.add_post("/v1/cluster/release", release)
