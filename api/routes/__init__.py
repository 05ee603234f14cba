"""Route table: every handler is registered here, and the OpenAPI document is built from it."""

from __future__ import annotations

from aiohttp import web

from . import admin, checkpoints, cluster, commits, console, parts, saves, ui, uploads
from .openapi import openapi_handler

# A namespace is up to 8 '/'-separated segments; the lazy match lets literal route parts
# that follow it (/checkpoints, /uploads) decide where it ends. vault.names validates it.
NS = "{ns:[^/].*?}"  # any text: the auth middleware answers 400 for a bad name


def setup_routes(app: web.Application) -> None:
    admin.add_routes(app)
    admin.add_policy_routes(app, NS)
    uploads.add_routes(app, NS)
    checkpoints.add_routes(app, NS)
    parts.add_routes(app, NS)
    saves.add_routes(app)
    commits.add_routes(app)
    cluster.add_routes(app)
    console.add_routes(app)
    ui.add_routes(app)
    app.router.add_get("/v1/openapi.json", openapi_handler)
