"""Which requests the audit log records (vault/audit.py), and the middleware recording them.

Audited: every state-changing request under /v1/admin/ (maintenance runs, backups,
tokens, session aborts), policy changes, and checkpoint PATCH (validity, pins, tags) and
DELETE, when they succeed. The entry names the token, the route, the path as sent, the
status, the request id and the JSON body's fields (never a response: a token's secret is
only ever in one). Refused requests are in the access log, not here.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from protocol import AuditEntry

from .auth import PRINCIPAL
from .errors import Handler
from .http import JSON_BODY, run
from .keys import CLOCK, VAULT
from .observability import request_id

_CHANGES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def audited(method: str, route: str) -> bool:
    if method not in _CHANGES:
        return False
    if route.startswith("/v1/admin/") or route.endswith("/policy") or route == "/v1/policy/default":
        return True
    return method in ("PATCH", "DELETE") and route.endswith("/checkpoints/{ref}")


def audit_middleware() -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        info = request.match_info.route.resource
        route = info.canonical if info is not None else request.path
        if response.status < 400 and audited(request.method, route):
            who = request.get(PRINCIPAL)
            body: Any = request.get(JSON_BODY) or {}
            entry = AuditEntry(
                at=request.app[CLOCK].now(),
                token=who.name if who is not None else "-",
                action=f"{request.method} {route}",
                target=request.path_qs,
                status=response.status,
                request_id=request_id(request),
                details=body if isinstance(body, dict) else {},
            )
            await run(request, request.app[VAULT].audit.append, entry)
        return response

    return middleware
