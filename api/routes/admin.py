"""Service and administration routes: health, stats, GC, check, tokens."""

from __future__ import annotations

from dataclasses import asdict

from aiohttp import web

from .. import __version__
from ..app import VAULT, refresh_tokens, run
from ..auth import require_admin
from ..http import json_body, json_response, query_bool


async def health(request: web.Request) -> web.Response:
    """Liveness; needs no token."""
    return json_response({"status": "ok", "version": __version__})


async def stats(request: web.Request) -> web.Response:
    """Logical and stored bytes, chunk and checkpoint counts, dedup ratio, per tier."""
    require_admin(request)
    return json_response(await run(request, request.app[VAULT].stats))


async def gc(request: web.Request) -> web.Response:
    """Collect expired uploads and chunks unreferenced past the grace period."""
    require_admin(request)
    report = await run(request, request.app[VAULT].gc, query_bool(request, "dry_run", False))
    return json_response(asdict(report))


async def check(request: web.Request) -> web.Response:
    """Recompute reference counts from manifests; `repair=true` fixes drifted counts."""
    require_admin(request)
    report = await run(request, request.app[VAULT].check, query_bool(request, "repair", False))
    return json_response({**asdict(report), "ok": report.ok})


async def create_token(request: web.Request) -> web.Response:
    """Create a token; its secret is in this answer only."""
    require_admin(request)
    body = await json_body(request)
    token, secret = await run(
        request, request.app[VAULT].tokens.create, body.get("name"), body.get("scopes")
    )
    await run(request, refresh_tokens, request.app)
    return json_response({**token.to_wire(), "token": secret}, status=201)


async def list_tokens(request: web.Request) -> web.Response:
    """Token names and scopes (never secrets)."""
    require_admin(request)
    tokens = await run(request, request.app[VAULT].tokens.all)
    return json_response({"tokens": [t.to_wire() for t in tokens]})


async def revoke_token(request: web.Request) -> web.Response:
    """Revoke a token by name; it stops working at once."""
    require_admin(request)
    await run(request, request.app[VAULT].tokens.revoke, request.match_info["name"])
    await run(request, refresh_tokens, request.app)
    return web.Response(status=204)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/health", health)
    app.router.add_get("/v1/stats", stats)
    app.router.add_post("/v1/admin/gc", gc)
    app.router.add_post("/v1/admin/check", check)
    app.router.add_post("/v1/admin/tokens", create_token)
    app.router.add_get("/v1/admin/tokens", list_tokens)
    app.router.add_delete("/v1/admin/tokens/{name}", revoke_token)
