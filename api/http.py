"""Small request/response helpers shared by the route modules: JSON bodies and answers,
query parsing, body tracking for shutdown, and `run` (engine calls on the worker pool)."""

from __future__ import annotations

import asyncio
import functools
import json
import math
import re
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from aiohttp import web

from checkpoint_vault.protocol import decode_bundle, decode_saves, parse_size
from checkpoint_vault.vault import InvalidRequest, TooLarge

from .auth import PRINCIPAL
from .keys import BODY_READERS, RUNTIME, SETTINGS, TURNS
from .transfer.bodies import MinRateBody

T = TypeVar("T")


def reading_body(request: web.Request) -> AbstractContextManager[None]:
    """Mark the current handler as reading its body, so shutdown may abort it."""
    return request.app[BODY_READERS].track()


async def run(request: web.Request, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run blocking engine work on the worker pool, off the event loop, within the calling
    token's share of the pool (api/turns.py: past it, the call waits in the token's own
    queue, holding no thread)."""
    loop = asyncio.get_running_loop()
    call = functools.partial(fn, *args, **kwargs)
    who = request.get(PRINCIPAL)
    async with request.app[TURNS].turn(who.name if who is not None else ""):
        return await loop.run_in_executor(request.app[RUNTIME].io, call)


# Small saves are cut, hashed and compressed on the event loop: handing a few tens of kB
# to the pool and back cost more than the work (the loop and the pool thread trade the
# interpreter lock; 16 agents, saves sent 4 to a request: 1.22-1.91 against 1.59-2.07 ms of
# server CPU per save, 580-887 against 540-771 saves/s, five pairs of runs). At this size
# the loop is held ~1 ms at most.
PREPARE_ON_LOOP_MAX = 256 << 10


async def run_small(
    request: web.Request, size: int, fn: Callable[..., T], *args: Any, **kwargs: Any
) -> T:
    """`run`, but work on `size` bytes up to PREPARE_ON_LOOP_MAX runs here, on the loop.
    Only for work that does not wait: `fn` must not block on the writer or the disk."""
    if size <= PREPARE_ON_LOOP_MAX:
        return fn(*args, **kwargs)
    return await run(request, fn, *args, **kwargs)


JSON_BODY = web.RequestKey("json_body", dict)

JSON_ON_LOOP_MAX = 64 << 10  # bodies up to this are parsed on the event loop (~0.3 ms at most)
MAX_JSON_CONTAINERS = 200_000  # arrays + objects in one body; a commit has ~2 per file
MAX_JSON_DEPTH = 64  # nesting of arrays and objects; metadata (32 deep) sits 2 levels down

# What the depth scan keeps of a body: escapes go first (they only occur inside strings),
# then everything but quotes and brackets, then the strings (now quote, brackets, quote).
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_NOT_SCANNED = bytes(b for b in range(256) if b not in b'"[]{}')
_STRING = re.compile(rb'"[^"]*"')


def _refuse_constant(name: str) -> None:
    raise InvalidRequest(f"body is not valid JSON: {name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    """A JSON number that fits a float: `1e400` would be infinity, echoed back as
    `Infinity` (not JSON) by every listing that holds it."""
    value = float(text)
    if not math.isfinite(value):
        raise InvalidRequest(f"body has a number too large for a float: {text[:40]}")
    return value


_DECODE = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float).decode


def json_depth(raw: bytes, limit: int) -> int:
    """How deep arrays and objects nest in the JSON text `raw`, counted no further than
    `limit + 1`. Brackets inside strings do not count. The body is reduced at C speed to
    its brackets (escapes, then all but quotes and brackets, then strings cut out), so the
    Python loop runs over at most `MAX_JSON_CONTAINERS` * 2 bytes: ~70 ms for an 8.8 MB
    commit of 90,000 files against ~200 ms for its parse. The parser's own recursion limit
    is no bound: it depends on the stack, and a 5,000-deep bundle header answered 500."""
    if b"\\" in raw:
        raw = _ESCAPE.sub(b"", raw)
    brackets = _STRING.sub(b"", raw.translate(None, _NOT_SCANNED))
    depth = deepest = 0
    for b in brackets:
        if b in b"[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        else:
            depth -= 1
    return deepest


def decode_json(raw: bytes) -> Any:
    """JSON text into Python values, or 400: the one parser every JSON input goes through
    (bodies and the one-request save's bundle header). Strict JSON only (NaN, Infinity and
    numbers past a float refused: echoed back they make listings invalid JSON), nested at
    most `MAX_JSON_DEPTH` deep, and a bounded count of containers. Each `[]` costs ~56 bytes
    of Python objects against 3 bytes of body, so a 16 MiB body of `[],` took 860 MB;
    strings and numbers cost far less, and a large commit is mostly 64-hex strings."""
    containers = raw.count(b"[") + raw.count(b"{")
    if containers > MAX_JSON_CONTAINERS:
        raise TooLarge(f"body has more than {MAX_JSON_CONTAINERS} JSON arrays and objects")
    if containers > MAX_JSON_DEPTH and json_depth(raw, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise InvalidRequest(f"body is not valid JSON: nested deeper than {MAX_JSON_DEPTH}")
    try:
        # What json.loads does with bytes, but with one decoder: given these hooks it made a
        # JSONDecoder (and its scanner) per call. The encoding as json.loads detects it.
        return _DECODE(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidRequest(f"body is not valid JSON: {e}") from None
    except RecursionError:  # unreachable past the depth scan; kept as the last line
        raise InvalidRequest("body is not valid JSON: nested too deeply") from None


async def decode_json_off_loop(request: web.Request, raw: bytes) -> Any:
    """`decode_json`, on the worker pool past `JSON_ON_LOOP_MAX` bytes so that one large
    body cannot stall every other request (health included)."""
    if len(raw) <= JSON_ON_LOOP_MAX:
        return decode_json(raw)
    return await run(request, decode_json, raw)


class TimedBody(MinRateBody):
    """The request body, read so that a client sending nothing for `body_timeout` seconds,
    or sending slower than `body_min_rate` once that long has passed, is answered 408 and
    dropped (api/transfer/bodies.py). A slow engine never times out a fast client: the idle timer
    counts only time spent waiting on the client; a body at 1 byte per 15 s used to hold
    a connection open indefinitely."""

    def __init__(self, request: web.Request) -> None:
        settings = request.app[SETTINGS]
        super().__init__(request.content, settings.body_timeout, settings.body_min_rate)


class Readable(Protocol):
    """A body read piece by piece: `TimedBody`, or aiohttp's own stream."""

    async def read(self, n: int = -1) -> bytes: ...


async def read_up_to(body: Readable, n: int) -> bytes:
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
    body = await decode_json_off_loop(request, raw)
    if not isinstance(body, dict):
        raise InvalidRequest("body must be a JSON object")
    request[JSON_BODY] = body  # what the audit log records of a change (api/audit.py)
    return body


def _bundle_header(raw: bytes, limit: int) -> Any:
    if len(raw) > limit:
        raise TooLarge(f"bundle header is larger than the {limit}-byte JSON body limit")
    return decode_json(raw)


async def bundle_body(request: web.Request) -> tuple[Mapping[str, Any], dict[str, bytes]]:
    """A one-request save's body: (header, {name: bytes}). The header is JSON like any
    body and goes through `decode_json` with the same limits (`max_json_body`, depth,
    containers, finite numbers); it was a plain `json.loads` on the event loop, where
    nesting 5,000 deep answered 500 and an 8 MiB `[],` header stalled health 3.2 s. Past
    `JSON_ON_LOOP_MAX` bytes of headers, or `PREPARE_ON_LOOP_MAX` of body, the whole bundle
    is taken apart on the worker pool."""
    return await _bundles(request, decode_bundle)


async def saves_body(request: web.Request) -> list[tuple[Mapping[str, Any], dict[str, bytes]]]:
    """The bundles of a `POST /v1/saves` body, each header through the same parser and
    limits as `bundle_body`'s, the whole body within `max_batch_body`."""
    return await _bundles(request, decode_saves)


async def _bundles(request: web.Request, decode: Callable[[bytes, Callable[[bytes], Any]], T]) -> T:
    settings = request.app[SETTINGS]
    body = await read_body(request, settings.max_batch_body)
    loads = functools.partial(_bundle_header, limit=settings.max_json_body)
    try:
        if len(body) <= PREPARE_ON_LOOP_MAX:  # what the loop then prepares too (run_small)
            try:
                return decode(body, _OnLoop(loads, JSON_ON_LOOP_MAX))
            except _PastBudget:
                pass
        return await run(request, decode, body, loads)
    except (ValueError, TypeError) as e:
        raise InvalidRequest(f"malformed checkpoint bundle: {e}") from None


class _PastBudget(Exception):  # noqa: N818 - a signal between two functions here, not an error
    """The headers of a bundle body come to more JSON than the event loop parses."""


class _OnLoop:
    """The headers' parser while a body is taken apart on the event loop: it parses up to
    `budget` bytes of JSON in all, then stops the loop's attempt (`_PastBudget`) and the
    pool takes the body apart. The budget counts the JSON, not the files' bytes: four agent
    states in a `POST /v1/saves` (~160 kB, <1 kB of headers) went to the pool and back for
    what is a few header parses and slices (~10% of a worker's CPU in bench_agents), and
    so did every single save past 64 kB (a LangGraph put of a long history)."""

    def __init__(self, loads: Callable[[bytes], Any], budget: int) -> None:
        self._loads = loads
        self._left = budget

    def __call__(self, raw: bytes) -> Any:
        self._left -= len(raw)
        if self._left < 0:
            raise _PastBudget
        return self._loads(raw)


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
    content = request.content
    if length is not None and content.is_eof() and not request.app[BODY_READERS].stopping:
        # The whole body came with its head (aiohttp saw its end): nothing to wait for,
        # so no idle timer to arm and cancel nor reader to track (~10 µs of a one-save
        # request such as a LangGraph put).
        data = content.read_nowait(-1)
        if len(data) != length:
            raise InvalidRequest("body ended before its Content-Length")
        return [data]
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
        raise InvalidRequest(
            f"query parameter {name} must be a size such as 50MiB, at most 1 EiB"
        ) from None
    if value <= 0:
        raise InvalidRequest(f"query parameter {name} must be positive")
    return float(value)


MAX_QUERY_INT = (1 << 63) - 1  # what LMDB keys, offsets and Python's C calls all hold


def query_int(request: web.Request, name: str, default: int) -> int:
    """A non-negative integer parameter, at most `MAX_QUERY_INT`: past that a count or an
    offset reached C code (a float, an LMDB key) and answered 500."""
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw) if len(raw) <= 20 else -1
    except ValueError:
        raise InvalidRequest(f"query parameter {name} must be an integer") from None
    if not 0 <= value <= MAX_QUERY_INT:
        raise InvalidRequest(f"query parameter {name} must be an integer from 0 to 2**63-1")
    return value
