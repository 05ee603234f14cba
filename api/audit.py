"""Which requests the audit log records (vault/audit.py), and the middleware recording them.

Audited: every state-changing request under /v1/admin/ (maintenance runs, backups,
tokens, session aborts), policy changes, and checkpoint PATCH (validity, pins, tags) and
DELETE, one or many (`DELETE .../checkpoints`, issue 30: it was not audited), when they
succeed. The entry names the token, the route, the path as sent (without its query), the
query parameters the route acts on (`AUDITED_PARAMS`, values capped), the status, the
request id and the JSON body's fields (never a response: a token's secret is only ever in
one); a bulk delete's entry lists the ids it deleted instead (`BULK_DELETED`). Refused
requests are in the access log, not here.

Entries are bounded by construction so that the log's retention bounds (`[audit]`) mean a
number of actions, not of bytes an attacker chose: the raw query (up to 8 KB of whatever a
client appends) used to be kept whole.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from checkpoint_vault.protocol import AuditEntry, BulkDeleted

from .auth import PRINCIPAL
from .errors import Handler
from .http import JSON_BODY, run
from .keys import CLOCK, VAULT
from .observability import request_id

_CHANGES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Query parameters audited routes act on (api/routes/admin.py); others have no effect and
# are not kept. A new parameter of an audited route belongs here.
AUDITED_PARAMS = frozenset({"dry_run", "repair", "namespace", "sample", "to"})
MAX_PARAM_CHARS = 256  # per value: a namespace or a backup file name fits
MAX_TARGET_CHARS = 1024  # the path; valid names keep it far shorter
MAX_LISTED_IDS = 50  # a bulk delete's ids in its entry (26 characters each: ~1.5 KB)
# What a bulk delete did (its answer), which its entry records instead of the JSON body.
BULK_DELETED = web.RequestKey("bulk_deleted", BulkDeleted)


def audited(method: str, route: str) -> bool:
    if method not in _CHANGES:
        return False
    if route.startswith("/v1/admin/") or route.endswith("/policy") or route == "/v1/policy/default":
        return True
    if method == "DELETE" and route.endswith("/checkpoints"):
        return True  # bulk delete
    return method in ("PATCH", "DELETE") and route.endswith("/checkpoints/{ref}")


def _bulk_details(request: web.Request, done: BulkDeleted) -> dict[str, Any]:
    """A bulk delete's entry: the ids it deleted (the first `MAX_LISTED_IDS`; every
    deleted checkpoint also keeps its tombstone) and how many were kept or not found (not
    the ids asked for: those may be anything)."""
    body = request.get(JSON_BODY) or {}
    return {
        "all": body.get("all") is True,
        "deleted": done.deleted[:MAX_LISTED_IDS],
        "deleted_count": len(done.deleted),
        "pinned_count": len(done.pinned),
        "not_found_count": len(done.not_found),
    }


def _cap(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _params(request: web.Request) -> dict[str, str]:
    return {
        k: _cap(request.query[k], MAX_PARAM_CHARS)
        for k in sorted(AUDITED_PARAMS.intersection(request.query))
    }


def _entry(request: web.Request, route: str, status: int) -> AuditEntry:
    who = request.get(PRINCIPAL)
    done = request.get(BULK_DELETED)
    body: Any = _bulk_details(request, done) if done is not None else request.get(JSON_BODY)
    return AuditEntry(
        at=request.app[CLOCK].now(),
        token=who.name if who is not None else "-",
        action=f"{request.method} {route}",
        target=_cap(request.path, MAX_TARGET_CHARS),
        status=status,
        request_id=request_id(request),
        details=body if isinstance(body, dict) else {},
        route=route,
        params=_params(request),
    )


def audit_middleware() -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        info = request.match_info.route.resource
        route = info.canonical if info is not None else request.path
        if response.status < 400 and audited(request.method, route):
            entry = _entry(request, route, response.status)
            await run(request, request.app[VAULT].audit.append, entry)
        return response

    return middleware
