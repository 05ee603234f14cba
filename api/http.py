"""Small request/response helpers shared by the route modules."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from vault import InvalidRequest

from .app import reading_body


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object; an empty body is `{}`."""
    with reading_body(request):
        raw = await request.read()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidRequest(f"body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("body must be a JSON object")
    return body


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=lambda o: json.dumps(o))


def query_bool(request: web.Request, name: str, default: bool) -> bool:
    raw = request.query.get(name)
    if raw is None:
        return default
    if raw.lower() in ("1", "true", "yes"):
        return True
    if raw.lower() in ("0", "false", "no"):
        return False
    raise InvalidRequest(f"query parameter {name} must be true or false")


def query_int(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise InvalidRequest(f"query parameter {name} must be an integer") from None
