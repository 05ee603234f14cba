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

from aiohttp import web

from protocol import DESCRIPTOR_TYPE, status_of
from vault import VaultError

from .observability import request_id

log = logging.getLogger("ckpt.api")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


RETRY_AFTER_SECONDS = 5  # what a 503 tells clients to wait: a tier or the store recovering


class ApiError(Exception):
    """An error of the service itself (auth, ranges); its status comes from the protocol's
    error table by code, like the engine's."""

    code = "invalid_request"
    status = status_of(code)
    close_connection = False  # drop the connection after answering (unread body)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.status = status_of(cls.code)

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


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


def error_response(
    status: int, code: str, message: str, extra: dict[str, object] | None = None
) -> web.Response:
    body: dict[str, object] = {"code": code, "message": message, **(extra or {})}
    return web.Response(
        status=status,
        text=json.dumps({"error": body}),
        content_type="application/json",
    )


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


def _answer(request: web.Request, e: Exception) -> tuple[web.Response, bool]:
    """The error answer for `e`, and whether the connection must close after it."""
    if isinstance(e, VaultError):
        response = error_response(e.status, e.code, e.message, e.details())
        if e.status in (429, 503):
            response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response, False
    if isinstance(e, ApiError):
        response = error_response(e.status, e.code, e.message)
        retry_after = getattr(e, "retry_after", None)
        if retry_after is not None:
            response.headers["Retry-After"] = str(retry_after)
        return response, e.close_connection
    if isinstance(e, web.HTTPException):
        if e.status < 400:
            raise e
        code = HTTP_CODES.get(e.status, FALLBACK_CLIENT if e.status < 500 else INTERNAL)
        response = error_response(e.status, code, e.reason)
        if "Allow" in e.headers:  # 405: which methods the resource has (RFC 9110 15.5.6)
            response.headers["Allow"] = e.headers["Allow"]
        return response, False
    rid = request_id(request)
    log.exception("internal error, request id %s", rid, extra={"request_id": rid})
    return error_response(
        500, INTERNAL, f"internal error; the server log has request id {rid}"
    ), False
