"""The coordinator of a commit across namespaces: whichever process took `POST /v1/commits`.

- One node, or every upload on one shard: that shard's owner commits them all in one writer
  transaction (vault/txn.py `commit_all`), here or asked with the same body.
- Several shards: two-phase commit, presumed abort, decided in the store (cluster/txn.py):
  1. each owner prepares its upload (`POST /v1/uploads/{id}/prepare`, or the engine here
     for this process's own shard), all at once; a refusal decides `abort` and is the
     answer; an owner that does not answer leaves the transaction undecided (503): a
     retry of it may still commit, else the resolvers abort it after their timeout;
  2. `txn/<id>` = `commit` by conditional create: if an owner's resolver aborted first
     (past its timeout) that is the decision, and the answer `TransactionAborted`;
  3. each owner applies (`POST /v1/uploads/{id}/resolve`: it reads the decision from the
     store itself), retried while an owner is away for up to `APPLY_WAIT`; past that the
     transaction is still committed, and the answer says so (503): the owner's resolver
     applies it when it is back, and a retry of the same transaction returns the records.
Every step is idempotent by transaction id, so a client retries the whole call with it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from checkpoint_vault.cluster import ClusterNode, NotOwner, upload_shard
from checkpoint_vault.cluster.txn import ABORT, COMMIT
from checkpoint_vault.vault import VaultError
from checkpoint_vault.vault.errors import (
    Fenced,
    InvalidRequest,
    MissingChunks,
    ReadOnlyStandby,
    TransactionAborted,
    Unavailable,
)
from checkpoint_vault.vault.records import StoredCheckpoint
from checkpoint_vault.vault.txn import Entry

from ..auth import principal, visible_record
from ..cluster import CLUSTER
from ..cluster.forward import FORWARDED, SESSION
from ..errors import ApiError, BodyTimeout, RequestTimeout
from ..http import run
from ..ratelimit import RateLimited
from .resolving import TxnService

APPLY_WAIT = 20.0  # seconds the coordinator retries an owner's apply (a restart, a takeover)
APPLY_RETRY = 0.25  # seconds between those tries

# An owner's answers that are about the owner, or this process's way to it, rather than the
# request: it failed (500) or is away for a moment (503), lost its shard or only follows a
# replica, or the body it was sent stalled. The answer is then `NotOwner` (503, retried).
_OWNER_FAILED = (500, 503)
_NOT_THE_REQUEST = (Fenced, ReadOnlyStandby, BodyTimeout, RequestTimeout)


@dataclass(frozen=True)
class Outcome:
    checkpoints: list[dict[str, Any]]  # wire records, in the order of the entries
    created: bool  # this call made at least one of them (else: a retry)


def relayed(status: int, answer: Any, retry_after: str | None = None) -> Exception:
    """The error an owner answered, as this process raises it: a refusal of the request as
    the class of its code, the engine's, else the service's (`of_code`, as a worker's
    errors are, node/calls.py), with the owner's message (it names the namespace) and
    Retry-After; anything else (`_OWNER_FAILED`, `_NOT_THE_REQUEST`, a code no class here
    declares) as `NotOwner`."""
    error = answer.get("error", {}) if isinstance(answer, dict) else {}
    code, message = str(error.get("code", "")), str(error.get("message", f"status {status}"))
    if code == "missing_chunks":
        e = MissingChunks([str(c) for c in error.get("missing") or []])
        e.message = message
        return e
    cls = VaultError.of_code(code) or ApiError.of_code(code)
    if cls is None or cls.status in _OWNER_FAILED or issubclass(cls, _NOT_THE_REQUEST):
        return NotOwner(f"a shard's owner answered {status}: {message}")
    refused = cls.rebuilt(message)
    if isinstance(refused, RateLimited):  # the owner's wait, passed on
        wait = retry_after or ""
        refused.retry_after = int(wait) if wait.isdigit() else 1
    return refused


async def commit_across(
    request: web.Request, service: TxnService, entries: Sequence[Entry], transaction: str
) -> Outcome:
    node = request.app.get(CLUSTER)
    domain = principal(request).domain()
    if node is None or service.decisions is None:
        return _made(request, await run(request, service.txns.commit_all, entries, domain))
    shards = {node.shard_of(e.namespace) for e in entries}
    for e in entries:
        if upload_shard(e.upload_id) != node.shard_of(e.namespace):
            raise InvalidRequest(f"upload {e.upload_id} is not an upload of {e.namespace!r}")
    if len(shards) == 1:  # one shard: its owner alone, one writer transaction
        (shard,) = shards
        if shard == node.shard and node.owns():
            return _made(request, await run(request, service.txns.commit_all, entries, domain))
        if FORWARDED in request.headers:  # two views of the shard's owner: never bounce
            raise NotOwner(f"shard {shard} moved while this commit was passed on; retry")
        body = {"transaction": transaction, "commits": [_wire(e) for e in entries]}
        status, answer = await _ask(request, node, shard, "/v1/commits", body)
        return Outcome(list(answer["checkpoints"]), status == 201)
    return await _two_phase(request, service, node, entries, transaction)


async def _two_phase(
    request: web.Request,
    service: TxnService,
    node: ClusterNode,
    entries: Sequence[Entry],
    transaction: str,
) -> Outcome:
    decisions = service.decisions
    assert decisions is not None
    prepared = await asyncio.gather(
        *(_prepare(request, service, node, e, transaction) for e in entries),
        return_exceptions=True,
    )
    refusal = next((r for r in prepared if isinstance(r, BaseException)), None)
    if refusal is not None and not isinstance(refusal, Exception):
        raise refusal  # cancelled: the client went away; the resolver aborts it
    if isinstance(refusal, Unavailable):  # an owner away: undecided, so a retry of this
        raise refusal  # transaction within the timeout may still commit (presumed abort after)
    decision = await service.call(decisions.decide, transaction, ABORT if refusal else COMMIT)
    if decision == ABORT:
        await asyncio.gather(
            *(_resolve(request, service, node, e, transaction) for e in entries),
            return_exceptions=True,  # best effort: each owner's resolver drops its own
        )
        raise refusal or TransactionAborted(
            f"transaction {transaction} was aborted (an owner refused its upload, or one "
            "stayed prepared past its timeout undecided): nothing of it is visible, and its "
            "uploads are open again (commit them in a new transaction)"
        )
    made = await asyncio.gather(
        *(_applied(request, service, node, e, transaction) for e in entries)
    )
    return Outcome([m[0] for m in made], any(m[1] for m in made))


async def _prepare(
    request: web.Request, service: TxnService, node: ClusterNode, entry: Entry, transaction: str
) -> None:
    async def here() -> tuple[int, Any]:
        domain = principal(request).domain()
        await run(request, service.txns.prepare, transaction, entry, domain)
        return 200, None

    path = f"/v1/uploads/{entry.upload_id}/prepare"
    await _at_owner(request, node, entry, here, path, {"transaction": transaction, **_wire(entry)})


async def _resolve(
    request: web.Request, service: TxnService, node: ClusterNode, entry: Entry, transaction: str
) -> tuple[dict[str, Any], bool]:
    async def here() -> tuple[int, Any]:
        rec, created = await run(request, service.settle_upload, transaction, entry.upload_id)
        return 201 if created else 200, visible_record(request, rec).to_wire()

    path = f"/v1/uploads/{entry.upload_id}/resolve"
    status, answer = await _at_owner(request, node, entry, here, path, {"transaction": transaction})
    return dict(answer), status == 201


async def _applied(
    request: web.Request, service: TxnService, node: ClusterNode, entry: Entry, transaction: str
) -> tuple[dict[str, Any], bool]:
    """The entry's checkpoint once its owner applied the decided commit, retried while the
    owner is away (bounded)."""
    deadline = time.monotonic() + APPLY_WAIT
    while True:
        try:
            return await _resolve(request, service, node, entry, transaction)
        except Unavailable as e:
            if time.monotonic() > deadline:
                raise NotOwner(
                    f"transaction {transaction} is committed, but the owner of "
                    f"{entry.namespace!r} has not applied it yet ({e.message}); it will when "
                    "it is back: retry with the same transaction for the records"
                ) from None
        await asyncio.sleep(APPLY_RETRY)  # the owner restarting or being taken over


async def _at_owner(
    request: web.Request,
    node: ClusterNode,
    entry: Entry,
    here: Callable[[], Awaitable[tuple[int, Any]]],
    path: str,
    body: dict[str, Any],
) -> tuple[int, Any]:
    shard = node.shard_of(entry.namespace)
    if shard == node.shard and node.owns():
        return await here()
    return await _ask(request, node, shard, path, body)


async def _ask(
    request: web.Request, node: ClusterNode, shard: int, path: str, body: dict[str, Any]
) -> tuple[int, Any]:
    """`POST path` on the shard's owner with the caller's token, as a forwarded request
    (so it is never passed on again); its error answers raised as this process's."""
    owner = node.live_owner(shard)
    headers = {
        "Authorization": request.headers.get("Authorization", ""),
        FORWARDED: node.config.node,
    }
    try:
        async with request.app[SESSION].post(
            owner.url.rstrip("/") + path, json=body, headers=headers
        ) as r:
            answer = await r.json(content_type=None)
            status, retry_after = r.status, r.headers.get("Retry-After")
    except (aiohttp.ClientError, ValueError):
        raise NotOwner(f"the owner of shard {shard} at {owner.url} did not answer") from None
    if status >= 300:
        raise relayed(status, answer, retry_after)
    return status, answer


def _wire(entry: Entry) -> dict[str, Any]:
    files = None if entry.files is None else {n: f.to_wire() for n, f in entry.files.items()}
    return {"namespace": entry.namespace, "upload_id": entry.upload_id, "files": files}


def _made(request: web.Request, made: list[tuple[StoredCheckpoint, bool]]) -> Outcome:
    records = [visible_record(request, rec).to_wire() for rec, _ in made]
    return Outcome(records, any(created for _, created in made))
