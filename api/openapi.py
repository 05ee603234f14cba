"""The OpenAPI 3 document, generated from the route table so it cannot drift from it.

Each operation's summary is its handler's docstring; parameters come from the path
template. Shapes of the main bodies are declared once below.
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from . import __version__

_PARAM = re.compile(r"\{(\w+)(?::[^}]*)?\}")

_ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
        }
    },
}
_CHECKPOINT = {
    "type": "object",
    "required": [
        "id",
        "namespace",
        "parent",
        "created_at",
        "metadata",
        "tags",
        "pinned",
        "validity",
        "files",
        "size",
        "tier",
    ],
    "properties": {
        "id": {"type": "string"},
        "namespace": {"type": "string"},
        "parent": {"type": ["string", "null"]},
        "created_at": {"type": "string", "format": "date-time"},
        "metadata": {"type": "object"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "pinned": {"type": "boolean"},
        "validity": {
            "type": "object",
            "properties": {
                "state": {"enum": ["unverified", "valid", "invalid"]},
                "reason": {"type": ["string", "null"]},
                "source": {"type": ["string", "null"]},
                "at": {"type": ["string", "null"]},
            },
        },
        "files": {"type": "object"},
        "size": {"type": "integer"},
        "tier": {"type": "string"},
    },
}


def build_openapi(app: web.Application) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in app.router.routes():
        if route.method == "HEAD" or route.resource is None:
            continue
        raw = route.resource.canonical
        path = _PARAM.sub(r"{\1}", raw)
        doc = (route.handler.__doc__ or "").strip().splitlines()
        op: dict[str, Any] = {
            "summary": doc[0] if doc else "",
            "operationId": getattr(route.handler, "__name__", "handler"),
            "parameters": [
                {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                for p in _PARAM.findall(raw)
            ],
            "responses": {
                "default": {
                    "description": "error",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                    },
                }
            },
        }
        if path == "/v1/health":
            op["security"] = []
        paths.setdefault(path, {})[route.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "Checkpoint Vault", "version": __version__},
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": _ERROR, "Checkpoint": _CHECKPOINT},
        },
        "paths": dict(sorted(paths.items())),
    }


async def openapi_handler(request: web.Request) -> web.Response:
    """This document."""
    return web.json_response(build_openapi(request.app))
