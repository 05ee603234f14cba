"""Small request/response helpers shared by the route modules: JSON bodies and answers,
query parsing, body tracking for shutdown, and `run` (engine calls on the worker pool)."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from aiohttp import web

from client.protocol import parse_size
from vault import InvalidRequest, TooLarge

from .keys import BODY_READERS, POOL

T = TypeVar("T")


def reading_body(request: web.Request) -> AbstractContextManager[None]:
    """Mark the current handler as reading its body, so shutdown may abort it."""
    return request.app[BODY_READERS].track()


async def run(request: web.Request, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run blocking engine work on the worker pool, off the event loop."""
    loop = asyncio.get_running_loop()
    call = functools.partial(fn, *args, **kwargs)
    return await loop.run_in_executor(request.app[POOL], call)


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


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole raw body, refusing more than `limit` bytes with 413 before reading them."""
    if request.content_length is not None and request.content_length > limit:
        raise TooLarge(f"body is larger than the {limit}-byte limit")
    if request.content_length is not None:  # known and within the limit: one read
        if request.content_length == 0:
            return b""
        with reading_body(request):
            try:
                return await request.content.readexactly(request.content_length)
            except asyncio.IncompleteReadError:
                raise InvalidRequest("body ended before its Content-Length") from None
    parts: list[bytes] = []
    size = 0
    with reading_body(request):
        while data := await request.content.read(min(1 << 20, limit + 1 - size)):
            parts.append(data)
            size += len(data)
            if size > limit:
                raise TooLarge(f"body is larger than the {limit}-byte limit")
    return b"".join(parts)


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


def query_size(request: web.Request, name: str) -> float | None:
    """A byte count or rate such as `50MB` (the config's size grammar); None when absent."""
    raw = request.query.get(name)
    if not raw:
        return None
    try:
        value = parse_size(raw)
    except ValueError:
        raise InvalidRequest(f"query parameter {name} must be a size such as 50MB") from None
    if value <= 0:
        raise InvalidRequest(f"query parameter {name} must be positive")
    return float(value)


def query_int(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise InvalidRequest(f"query parameter {name} must be an integer") from None
