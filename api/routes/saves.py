"""`POST /v1/saves`: several one-request saves in one request.

An agent platform saves many conversations at once; each save alone is a small request
whose HTTP exchange, authentication, thread hops and answer cost the server more than the
save itself (about 2 ms of CPU against ~0.5 for the writer's part). A client that has
several saves waiting sends them together (client/coalesce.py), and they share all of
that: one exchange, one preparation of them all (on the event loop when small, else one
turn on the worker pool), one hop to the writer, whose group commit then takes them in one
batch.

Each save keeps everything it has alone: its own namespace and write permission, its own
charge against the token's rate limit, its own checks, idempotency key and transaction
(one failing leaves the others as they are). The answer is 200 with one entry per save, in
order: `{"status": 201 | 200, "checkpoint": ...}` or `{"status": 4xx | 5xx, "error":
{"code", "message"}, "retry_after"?}`, what that save would have answered alone. Only a
body that cannot be taken apart, or that no token may send, is refused as a whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from checkpoint_vault.vault import InvalidRequest

from ..auth import principal, require, visible_record
from ..errors import refusal
from ..http import json_response, saves_body
from ..keys import LIMITER, SAVES
from ..saving import PendingSave
from .checkpoints import save_options


async def save_many(request: web.Request) -> web.Response:
    """Several one-request saves (body: bundles whose headers name their namespace); one
    answer entry per save, in order."""
    bodies = await saves_body(request)
    saves = [_checked(request, header, files, i > 0) for i, (header, files) in enumerate(bodies)]
    todo = [s for s in saves if s.outcome is None]
    if todo:
        await request.app[SAVES].save_all(request, todo)
    return json_response({"results": [_entry(request, s) for s in saves]})


def _checked(
    request: web.Request, header: Mapping[str, Any], files: dict[str, bytes], charge: bool
) -> PendingSave:
    """A save as the body states it, with what refuses it before any work: no namespace,
    no write permission, the token past its rate (`charge`: every save after the first is
    a request of its own; the first was charged as the request), or a bad option."""
    ns = header.get("namespace")
    save = PendingSave(ns if isinstance(ns, str) else "", files)
    try:
        if not isinstance(ns, str):
            raise InvalidRequest("each save's header must name its namespace")
        require(request, "write", ns)
        who = principal(request)
        if charge and not who.is_admin:
            request.app[LIMITER].take(who.name)
        save.options = save_options(request, header)
    except Exception as e:  # noqa: BLE001 - this save's answer, not the request's
        save.outcome = e
    return save


def _entry(request: web.Request, save: PendingSave) -> dict[str, Any]:
    outcome = save.outcome
    if isinstance(outcome, tuple):
        record, created = outcome
        return {
            "status": 201 if created else 200,
            "checkpoint": visible_record(request, record).to_wire(),
        }
    assert outcome is not None
    r = refusal(request, outcome)
    entry: dict[str, Any] = {"status": r.status, "error": r.error}
    if r.retry_after is not None:
        entry["retry_after"] = float(r.retry_after)
    return entry


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/saves", save_many)
