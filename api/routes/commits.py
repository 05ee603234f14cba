"""Commits across namespaces (api/txn/): `POST /v1/commits` on any node, and the two steps
a coordinator asks of each upload's owner, prepare and resolve."""

from __future__ import annotations

import secrets
from typing import Any

from aiohttp import web

from checkpoint_vault.vault import Conflict, InvalidRequest
from checkpoint_vault.vault.names import check_namespace
from checkpoint_vault.vault.txn import Entry, check_transaction

from .. import parse
from ..auth import principal, require, visible_record
from ..http import json_body, json_response, run
from ..keys import VAULT
from ..txn import TXN, commit_across


def _entries(value: Any) -> list[Entry]:
    if not isinstance(value, list) or not value:
        raise InvalidRequest("commits must be a list of {namespace, upload_id, files}")
    return [_entry(item) for item in value]


def _entry(item: Any) -> Entry:
    if not isinstance(item, dict):
        raise InvalidRequest("each commit is an object {namespace, upload_id, files}")
    ns, upload = item.get("namespace"), item.get("upload_id")
    if not isinstance(ns, str) or not isinstance(upload, str) or not 0 < len(upload) <= 64:
        raise InvalidRequest("each commit names its namespace and upload_id")
    return Entry(check_namespace(ns), upload, parse.commit_files(item.get("files")))


async def commit_all(request: web.Request) -> web.Response:
    """Commit uploads of several namespaces all or nothing; a retry with the same
    transaction returns the same checkpoints (200)."""
    body = await json_body(request)
    given = body.get("transaction")
    transaction = check_transaction(secrets.token_hex(16) if given is None else given)
    entries = _entries(body.get("commits"))
    for e in entries:  # the token must be allowed to save into every namespace named
        require(request, "write", e.namespace)
    outcome = await commit_across(request, request.app[TXN], entries, transaction)
    answer = {"transaction": transaction, "checkpoints": outcome.checkpoints}
    return json_response(answer, status=201 if outcome.created else 200)


async def _upload_namespace(request: web.Request) -> str:
    session = await run(
        request, request.app[VAULT].uploads.session, request.match_info["upload_id"]
    )
    require(request, "write", session.namespace)
    return session.namespace


async def prepare(request: web.Request) -> web.Response:
    """Prepare the upload for a commit across namespaces (a coordinator's first step)."""
    ns = await _upload_namespace(request)
    body = await json_body(request)
    transaction = check_transaction(body.get("transaction"))
    if body.get("namespace") != ns:
        raise Conflict(f"upload is not an upload of {str(body.get('namespace'))[:200]!r}")
    entry = Entry(ns, request.match_info["upload_id"], parse.commit_files(body.get("files")))
    service = request.app[TXN]
    if service.decisions is None:  # nothing here would ever decide it
        raise Conflict("this server is not part of a cluster: POST /v1/commits")
    domain = principal(request).domain()
    await run(request, service.txns.prepare, transaction, entry, domain)
    return json_response({"transaction": transaction, "upload_id": entry.upload_id})


async def resolve(request: web.Request) -> web.Response:
    """Bring the prepared upload to its transaction's decision, read from the cluster's
    store (a coordinator's last step): the checkpoint once committed."""
    await _upload_namespace(request)
    body = await json_body(request)
    transaction = check_transaction(body.get("transaction"))
    service = request.app[TXN]
    rec, created = await run(
        request, service.settle_upload, transaction, request.match_info["upload_id"]
    )
    return json_response(visible_record(request, rec).to_wire(), status=201 if created else 200)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/commits", commit_all)
    app.router.add_post("/v1/uploads/{upload_id}/prepare", prepare)
    app.router.add_post("/v1/uploads/{upload_id}/resolve", resolve)
