"""Small request/response helpers shared by the route modules: JSON bodies and answers,
query parsing, body tracking for shutdown, and `run` (engine calls on the worker pool)."""

from __future__ import annotations

import asyncio
import functools
import json
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from aiohttp import web

from protocol import parse_size
from vault import InvalidRequest, TooLarge

from .errors import BodyTimeout
from .keys import BODY_READERS, RUNTIME, SETTINGS

T = TypeVar("T")


def reading_body(request: web.Request) -> AbstractContextManager[None]:
    """Mark the current handler as reading its body, so shutdown may abort it."""
    return request.app[BODY_READERS].track()


async def run(request: web.Request, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run blocking engine work on the worker pool, off the event loop."""
    loop = asyncio.get_running_loop()
    call = functools.partial(fn, *args, **kwargs)
    return await loop.run_in_executor(request.app[RUNTIME].io, call)


JSON_BODY = web.RequestKey("json_body", dict)

JSON_ON_LOOP_MAX = 64 << 10  # bodies up to this are parsed on the event loop (~0.3 ms at most)
MAX_JSON_CONTAINERS = 200_000  # arrays + objects in one body; a commit has ~2 per file


def _refuse_constant(name: str) -> None:
    raise InvalidRequest(f"body is not valid JSON: {name} is not a number JSON allows")


def decode_json(raw: bytes) -> Any:
    """JSON text into Python values, or 400: strict JSON only (NaN and Infinity refused:
    echoed back they make listings invalid JSON), no deeper than the parser's recursion
    limit, and a bounded count of containers. Each `[]` costs ~56 bytes of Python objects
    against 3 bytes of body, so a 16 MiB body of `[],` took 860 MB; strings and numbers
    cost far less, and a large commit is mostly 64-hex strings."""
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_CONTAINERS:
        raise TooLarge(f"body has more than {MAX_JSON_CONTAINERS} JSON arrays and objects")
    try:
        return json.loads(raw, parse_constant=_refuse_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidRequest(f"body is not valid JSON: {e}") from None
    except RecursionError:
        raise InvalidRequest("body is not valid JSON: nested too deeply") from None


class TimedBody:
    """The request body, read so that a client sending nothing for `body_timeout` seconds
    is answered 408 and dropped. Only time spent waiting on the client counts (not time
    the handler spends on a piece it read), so a slow engine never times out a fast
    client; a body at 1 byte per 15 s used to hold a connection open indefinitely."""

    def __init__(self, request: web.Request) -> None:
        self._content = request.content
        self._idle = request.app[SETTINGS].body_timeout

    async def read(self, n: int = -1) -> bytes:
        # A timer that cancels this task (asyncio.timeout needs 3.11; we support 3.10).
        task = asyncio.current_task()
        assert task is not None
        fired = False

        def expire() -> None:
            nonlocal fired
            fired = True
            task.cancel()

        timer = asyncio.get_running_loop().call_later(self._idle, expire)
        try:
            return await self._content.read(n)
        except asyncio.CancelledError:
            if not fired:
                raise
            if sys.version_info >= (3, 11):
                task.uncancel()  # the cancellation was ours, and it is handled here
            raise BodyTimeout(f"no body bytes arrived for {self._idle:g} s") from None
        finally:
            timer.cancel()


async def read_up_to(body: TimedBody, n: int) -> bytes:
    """Up to `n` bytes of a streamed body: fewer only at its end. A socket read returns
    whatever has arrived, so pieces are gathered until `n` (one piece is returned as is)."""
    parts: list[bytes] = []
    got = 0
    while got < n:
        piece = await body.read(n - got)
        if not piece:
            break
        parts.append(piece)
        got += len(piece)
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object; an empty body is `{}`. Large bodies are parsed on the
    worker pool, so one big request cannot stall every other (health included)."""
    raw = await read_body(request, request.app[SETTINGS].max_json_body)
    if not raw.strip():
        return {}
    body = (
        decode_json(raw) if len(raw) <= JSON_ON_LOOP_MAX else await run(request, decode_json, raw)
    )
    if not isinstance(body, dict):
        raise InvalidRequest("body must be a JSON object")
    request[JSON_BODY] = body  # what the audit log records of a change (api/audit.py)
    return body


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole raw body, refusing more than `limit` bytes with 413 before reading them."""
    parts = await _body_parts(request, limit)
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def read_writable_body(request: web.Request, limit: int) -> bytearray:
    """`read_body` into one buffer the handler may write into (a chunk batch's frames are
    built inside it instead of copied out of it)."""
    return bytearray().join(await _body_parts(request, limit))


async def _body_parts(request: web.Request, limit: int) -> list[bytes]:
    length = request.content_length
    if length is not None and length > limit:
        raise TooLarge(f"body is larger than the {limit}-byte limit")
    if length == 0:
        return [b""]
    parts: list[bytes] = []
    size = 0
    body = TimedBody(request)
    with reading_body(request):
        # With a length, reading stops at it: no further read (and timer) just to see EOF.
        while size != length and (data := await body.read(min(1 << 20, limit + 1 - size))):
            parts.append(data)
            size += len(data)
            if size > limit:
                raise TooLarge(f"body is larger than the {limit}-byte limit")
    if length is not None and size != length:
        raise InvalidRequest("body ended before its Content-Length")
    return parts or [b""]


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(data).encode(),
        status=status,
        content_type="application/json",
        charset="utf-8",
    )


async def large_json_response(request: web.Request, data: Any, status: int = 200) -> web.Response:
    """`json_response` with the encoding on the worker pool: for answers that can run to
    megabytes (a 100k-id `missing` answer is 6.7 MB, ~50 ms of encoding)."""
    text = await run(request, json.dumps, data)
    return web.Response(text=text, status=status, content_type="application/json")


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
    """A byte count or rate such as `50MiB` (the config's size grammar); None when absent."""
    raw = request.query.get(name)
    if not raw:
        return None
    try:
        value = parse_size(raw)
    except ValueError:
        raise InvalidRequest(f"query parameter {name} must be a size such as 50MiB") from None
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
