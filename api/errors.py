"""The one place errors become HTTP responses.

Engine errors (`vault.VaultError`) and the service's own (`ApiError`) carry their status and
wire code; `error_middleware` turns them, and aiohttp's own HTTP errors, into the JSON error
shape. Anything else is a bug: logged with a request id and answered 500, with no internal
detail in the body.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from checkpoint_vault.protocol import DESCRIPTOR_TYPE, TabledError
from checkpoint_vault.vault import VaultError

from .observability import request_id

log = logging.getLogger("ckpt.api")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


RETRY_AFTER_SECONDS = 5  # what a 503 tells clients to wait: a tier or the store recovering


class ApiError(TabledError):
    """An error of the service itself (auth, ranges); its status comes from the protocol's
    error table by code, like the engine's."""

    code = "invalid_request"
    close_connection = False  # drop the connection after answering (unread body)


class Unauthorized(ApiError):
    code = "unauthorized"


class Forbidden(ApiError):
    code = "forbidden"


class InvalidRange(ApiError):
    code = "invalid_range"


class BodyTimeout(ApiError):
    """The client stopped sending its body (`server.body_timeout` without a byte)."""

    code = "body_timeout"
    close_connection = True  # else aiohttp lingers 10 s reading the rest of the body


class RequestTimeout(ApiError):
    """A file handed over by descriptor made no progress: its read or write never returned
    (a hung file system); the hand-over thread is left to it (api/transfer/receive.py)."""

    code = "request_timeout"
    close_connection = True


# aiohttp's own HTTP errors (unknown route, wrong method, body too large...) by status.
HTTP_CODES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "invalid_request",
    413: "too_large",
    503: "unavailable",
}

FALLBACK_CLIENT = "invalid_request"  # any other 4xx aiohttp raises
INTERNAL = "internal"  # any other 5xx, and every exception that is a bug


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except (ConnectionResetError, TimeoutError):
        raise
    except Exception as e:  # noqa: BLE001 - every error is answered here, bugs included
        response, close = _answer(request, e)
    # A client handing a descriptor over waits for `100 Continue` before sending its
    # one-byte body, so a refusal leaves it unsent: aiohttp would wait 10 s for it.
    if (close or request.content_type == DESCRIPTOR_TYPE) and request.protocol is not None:
        response.force_close()
        await response.prepare(request)  # sent whole, then the connection is dropped
        await response.write_eof()
        request.protocol.force_close()
    return response


@dataclass(frozen=True)
class Refusal:
    """How the service answers an error: status, the JSON error object, the headers it
    needs, and whether the connection must close after it. One answer of a request, or one
    entry of a request that carries several (`POST /v1/saves`)."""

    status: int
    error: dict[str, object]
    retry_after: str | None = None
    allow: str | None = None
    close: bool = False


def refusal(request: web.Request, e: Exception) -> Refusal:
    """What `e` answers: engine and service errors by their code, aiohttp's by status,
    anything else a bug (logged with the request id; 500 with no detail)."""
    if isinstance(e, VaultError):
        # an error may say how soon (a cluster's shard changing hands: cluster/errors.py)
        wait = getattr(e, "retry_after", RETRY_AFTER_SECONDS)
        after = str(wait) if e.status in (429, 503) else None
        return Refusal(e.status, {"code": e.code, "message": e.message, **e.details()}, after)
    if isinstance(e, ApiError):
        retry_after = getattr(e, "retry_after", None)
        return Refusal(
            e.status,
            {"code": e.code, "message": e.message},
            None if retry_after is None else str(retry_after),
            close=e.close_connection,
        )
    if isinstance(e, web.HTTPException):
        if e.status < 400:
            raise e
        code = HTTP_CODES.get(e.status, FALLBACK_CLIENT if e.status < 500 else INTERNAL)
        # 405: which methods the resource has (RFC 9110 15.5.6)
        return Refusal(e.status, {"code": code, "message": e.reason}, allow=e.headers.get("Allow"))
    rid = request_id(request)
    log.exception("internal error, request id %s", rid, extra={"request_id": rid})
    return Refusal(
        500, {"code": INTERNAL, "message": f"internal error; the server log has request id {rid}"}
    )


def _answer(request: web.Request, e: Exception) -> tuple[web.Response, bool]:
    """The error answer for `e`, and whether the connection must close after it."""
    r = refusal(request, e)
    response = web.Response(
        status=r.status, text=json.dumps({"error": r.error}), content_type="application/json"
    )
    if r.retry_after is not None:
        response.headers["Retry-After"] = r.retry_after
    if r.allow is not None:
        response.headers["Allow"] = r.allow
    return response, r.close
