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

import asyncio
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from vault import InvalidRequest, PreparedSave, StoredCheckpoint, Vault
from vault.direct import SaveOptions

from ..auth import principal, require, visible_record
from ..calls import CallClient
from ..errors import refusal
from ..http import json_response, run_small, saves_body
from ..keys import LIMITER, VAULT, WRITER
from .checkpoints import save_options

Saved = tuple[StoredCheckpoint, bool]


@dataclass
class _Save:
    """One save of the body, on its way: what it asks, then what became of it."""

    namespace: str
    files: dict[str, bytes]
    options: SaveOptions | None = None
    prepared: PreparedSave | None = None
    outcome: Saved | Exception | None = None


async def save_many(request: web.Request) -> web.Response:
    """Several one-request saves (body: bundles whose headers name their namespace); one
    answer entry per save, in order."""
    bodies = await saves_body(request)
    saves = [_checked(request, header, files, i > 0) for i, (header, files) in enumerate(bodies)]
    vault, writer = request.app[VAULT], request.app.get(WRITER)
    todo = [s for s in saves if s.outcome is None]
    if todo and writer is None:
        await _commit_here(request, vault, todo)
    elif todo and writer is not None:
        await _commit_through(request, vault, writer, todo)
    return json_response({"results": [_entry(request, s) for s in saves]})


async def _commit_here(request: web.Request, vault: Vault, saves: list[_Save]) -> None:
    """The process that writes: each save goes to the writer as soon as it is prepared."""
    committing = await run_small(
        request, _bytes(saves), _prepare_all, vault, saves, vault.commit_prepared
    )
    outcomes = await asyncio.gather(
        *(asyncio.wrap_future(f) for _, f in committing), return_exceptions=True
    )
    for (save, _), outcome in zip(committing, outcomes, strict=True):
        if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
            raise outcome  # cancelled: the client went away
        save.outcome = outcome


async def _commit_through(
    request: web.Request, vault: Vault, writer: CallClient, saves: list[_Save]
) -> None:
    """A worker: all of them prepared, then in one frame to the process that writes
    (api/calls.py), which queues them at once for one writer batch."""
    await run_small(request, _bytes(saves), _prepare_all, vault, saves, None)
    ready = [(s, s.prepared) for s in saves if s.prepared is not None]
    if ready:
        answers = await writer.save_all([p for _, p in ready])
        for (save, _), answer in zip(ready, answers, strict=True):
            save.outcome = answer


def _bytes(saves: list[_Save]) -> int:
    return sum(len(data) for s in saves for data in s.files.values())


def _checked(
    request: web.Request, header: Mapping[str, Any], files: dict[str, bytes], charge: bool
) -> _Save:
    """A save as the body states it, with what refuses it before any work: no namespace,
    no write permission, the token past its rate (`charge`: every save after the first is
    a request of its own; the first was charged as the request), or a bad option."""
    ns = header.get("namespace")
    save = _Save(ns if isinstance(ns, str) else "", files)
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


def _prepare_all(
    vault: Vault, saves: list[_Save], submit: Callable[[PreparedSave], Future[Saved]] | None
) -> list[tuple[_Save, Future[Saved]]]:
    """Cut, hash and compress each save (all in one call: `run_small`); with
    `submit`, hand each to the writer as soon as it is ready (it commits the first while
    the rest are prepared), else keep it (`prepared`) for one hand-over of them all."""
    committing = []
    for s in saves:
        assert s.options is not None
        try:
            prepared = vault.prepare_save(s.namespace, s.files, **s.options)
        except Exception as e:  # noqa: BLE001 - this save's answer
            s.outcome = e
            continue
        if submit is None:
            s.prepared = prepared
        else:
            committing.append((s, submit(prepared)))
    return committing


def _entry(request: web.Request, save: _Save) -> dict[str, Any]:
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
