"""Service and administration routes: health, stats, maintenance, policies, tokens.

Maintenance routes run the same tasks as the schedule and the offline CLI (maintenance/)
through `run_job`: the task joins the maintenance queue (api/jobs.py) and the route awaits
it without holding a worker thread; a route started while another operation runs waits
for it (409 when the queue is full, 503 when the server stops first). Paced tasks refuse a
rate below `maintenance.MIN_RATE` (400) before anything is queued.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from dataclasses import replace
from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from checkpoint_vault import maintenance
from checkpoint_vault.protocol import Health, TokenIssued
from checkpoint_vault.vault import InvalidRequest
from checkpoint_vault.vault.clock import rfc3339
from checkpoint_vault.vault.policy import parse_duration
from checkpoint_vault.vault.tokens import scope_warnings

from .. import __version__
from ..auth import principal, require_admin
from ..errors import Forbidden
from ..http import json_body, json_response, query_bool, query_int, query_size, run
from ..jobs import run_job
from ..keys import CALLS, INSTANCE, METRICS, QUEUE, SETTINGS, TOKENS, VAULT, WORKER
from ..observability import merged_metrics
from ..transfer.peers import same_user


async def health(request: web.Request) -> web.Response:
    """Liveness and role (primary, standby, fenced; a standby's lag behind its replica);
    needs no token."""
    vault = request.app[VAULT]
    socket = request.app[SETTINGS].socket_path
    health = Health(
        status="ok",
        version=__version__,
        role=vault.roles.role,
        instance=request.app[INSTANCE],
        worker=request.app[WORKER],
        # a client on this machine may hand files over
        local_socket=str(socket) if socket is not None and on_this_machine(request) else None,
        lag_seconds=vault.roles.standby.status().lag_seconds
        if vault.roles.standby is not None
        else None,
    )
    return json_response(health.to_wire())


def on_this_machine(request: web.Request) -> bool:
    """Whether the caller can use the local socket, so may learn its path (and the data
    dir's): a caller on the socket itself (no address), or one on loopback whose socket is
    owned by this server's user or root (api/peers.py). A reverse proxy on this host, whose
    callers all look like loopback, runs as another user."""
    remote = request.remote
    if not remote:
        return True
    if remote != "::1" and not remote.startswith("127."):
        return False
    transport = request.transport
    if transport is None:
        return False
    local, peer = transport.get_extra_info("sockname"), transport.get_extra_info("peername")
    return same_user(local, peer, os.getuid())


async def promote(request: web.Request) -> web.Response:
    """Turn this standby into the primary: apply everything the replica has, claim the next
    epoch (which fences the old primary), then replicate to the same tier and take writes."""
    require_admin(request)
    vault = request.app[VAULT]
    return json_response((await run(request, vault.roles.promote)).to_wire())


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text exposition (admin or `metrics` scope)."""
    who = principal(request)
    if not (who.is_admin or "metrics" in who.scopes):
        raise Forbidden(f"token {who.name!r} lacks the metrics scope")
    calls = request.app.get(CALLS)  # with workers: their request counters too
    others = await calls.worker_metrics() if calls is not None else []
    registry = request.app[METRICS].registry
    body = await run(request, lambda: merged_metrics(generate_latest(registry), others))
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def stats(request: web.Request) -> web.Response:
    """Logical and stored bytes, chunk and checkpoint counts, dedup ratio, per tier and
    recoded codec; `namespaces=true` adds each namespace's stored and logical bytes (a scan
    of every manifest)."""
    require_admin(request)
    vault = request.app[VAULT]
    report = await run(request, vault.stats)
    if query_bool(request, "namespaces", False):
        report = replace(report, by_namespace=await run(request, vault.usage))
    return json_response(report.to_wire())


async def gc(request: web.Request) -> web.Response:
    """Collect expired uploads and chunks unreferenced past the grace period; with tiers,
    then repack the packs that left dead bytes in (as the scheduled GC does)."""
    require_admin(request)
    vault = request.app[VAULT]
    dry_run = query_bool(request, "dry_run", False)
    stop = request.app[QUEUE].stopping
    result = await run_job(request.app, "gc", lambda: maintenance.gc(vault, dry_run, stop))
    return json_response(result.to_wire())


async def check(request: web.Request) -> web.Response:
    """Recompute reference counts from manifests; `repair=true` fixes counts, drops orphans."""
    require_admin(request)
    vault = request.app[VAULT]
    repair = query_bool(request, "repair", False)
    stop = request.app[QUEUE].stopping
    report = await run_job(request.app, "check", lambda: maintenance.check(vault, repair, stop))
    return json_response(report.to_wire())


async def retention(request: web.Request) -> web.Response:
    """Plan retention (dry_run=true, the default) or apply exactly that plan."""
    require_admin(request)
    vault = request.app[VAULT]
    dry_run = query_bool(request, "dry_run", True)
    namespace = request.query.get("namespace") or None
    result = await run_job(
        request.app, "retention", lambda: maintenance.retention(vault, dry_run, namespace)
    )
    return json_response(result.to_wire())


async def verify(request: web.Request) -> web.Response:
    """Re-read chunks and check their ids; invalidate what uses damaged ones, heal the rest;
    `rate` (extension, a size per second, at least 1MiB) paces the reading."""
    require_admin(request)
    vault = request.app[VAULT]
    try:
        sample = float(request.query.get("sample", "1"))
    except ValueError:
        raise InvalidRequest("sample must be a number in (0, 1]") from None
    namespace = request.query.get("namespace") or None
    rate = maintenance.check_rate(query_size(request, "rate"))
    stop = request.app[QUEUE].stopping
    report = await run_job(
        request.app, "scrub", lambda: maintenance.scrub(vault, namespace, sample, rate, stop)
    )
    return json_response(report.to_wire())


async def compact(request: web.Request) -> web.Response:
    """Re-encode older checkpoints as deltas against their successors (byte-grouped when a
    chain is long enough); answers when done, with what it saved. `rate` is at least 1MiB
    (per second): a slower one would hold the maintenance queue for days."""
    require_admin(request)
    vault = request.app[VAULT]
    namespace = request.query.get("namespace") or None
    rate = maintenance.check_rate(query_size(request, "rate"))
    stop = request.app[QUEUE].stopping
    report = await run_job(
        request.app, "compact", lambda: maintenance.compact(vault, namespace, rate, stop)
    )
    return json_response(report.to_wire())


async def tiering(request: web.Request) -> web.Response:
    """Plan (dry_run=true, the default) or run demotion of old checkpoints' chunks."""
    require_admin(request)
    vault = request.app[VAULT]
    dry_run = query_bool(request, "dry_run", True)
    stop = request.app[QUEUE].stopping
    result = await run_job(
        request.app, "tiering", lambda: maintenance.tiering(vault, dry_run, stop)
    )
    return json_response(result.to_wire())


_BACKUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def backup_target(to: str | None, tiers: Collection[str], backup_dir: Path | None) -> str | None:
    """Where an online backup may go: a tier, or a file directly in `[server] backup_dir`,
    named bare (`nightly.mdb`) or by its absolute path there. Any other path is refused:
    `?to=/home/u/.ssh/authorized_keys` used to overwrite any file the server user could
    write, with bytes a writer chose (small files are stored raw in the catalog)."""
    if to is None or to in tiers:
        return to
    name = to
    if os.path.isabs(to):
        parent, name = os.path.split(os.path.normpath(to))
        if backup_dir is None or Path(parent) != backup_dir:
            raise InvalidRequest(
                "backups go to a tier or into the configured [server] backup_dir only"
            )
    if backup_dir is None:
        raise InvalidRequest(f"{to!r} is not a configured tier, and no [server] backup_dir is set")
    if not _BACKUP_NAME.fullmatch(name):
        raise InvalidRequest("a backup file name is [A-Za-z0-9][A-Za-z0-9._-]{0,127}")
    return str(backup_dir / name)


async def catalog_backup(request: web.Request) -> web.Response:
    """A consistent copy of the catalog, taken while serving, to a tier or `backup_dir`."""
    require_admin(request)
    vault = request.app[VAULT]
    to = backup_target(
        request.query.get("to") or None, vault.tiers, request.app[SETTINGS].backup_dir
    )
    result = await run_job(
        request.app, "catalog_backup", lambda: maintenance.catalog_backup(vault, to)
    )
    return json_response(result.to_wire(), status=201)


async def get_policy(request: web.Request) -> web.Response:
    """A namespace's retention and tiering policy (its own, without the default merged)."""
    require_admin(request)
    ns = request.match_info.get("ns")
    policy = await run(request, request.app[VAULT].policy, ns)
    return json_response(policy.to_record().to_wire())


async def put_policy(request: web.Request) -> web.Response:
    """Change some keys of a policy; the others keep their values."""
    require_admin(request)
    ns = request.match_info.get("ns")
    body = await json_body(request)
    policy = await run(request, request.app[VAULT].set_policy, ns, body)
    return json_response(policy.to_record().to_wire())


async def create_token(request: web.Request) -> web.Response:
    """Create a token; its secret is in this answer only."""
    require_admin(request)
    body = await json_body(request)
    expires = body.get("expires")
    token, secret = await run(
        request,
        request.app[VAULT].tokens.create,
        body.get("name"),
        body.get("scopes"),
        parse_duration(expires, "expires") if expires is not None else None,
    )
    await run(request, refresh_tokens, request.app)
    issued = TokenIssued.of(token.to_record(), secret, scope_warnings(token.scopes))
    return json_response(issued.to_wire(), status=201)


async def rotate_token(request: web.Request) -> web.Response:
    """A new secret for a token; the old one keeps working for `grace` (default 1h)."""
    require_admin(request)
    body = await json_body(request)
    grace = parse_duration(body.get("grace", "1h"), "grace")
    token, secret = await run(
        request, request.app[VAULT].tokens.rotate, request.match_info["name"], grace
    )
    await run(request, refresh_tokens, request.app)
    return json_response(TokenIssued.of(token.to_record(), secret).to_wire(), status=201)


async def list_tokens(request: web.Request) -> web.Response:
    """Token names, scopes, expiry and last use (never secrets); a token being rotated
    is listed once per secret."""
    require_admin(request)
    tokens = request.app[VAULT].tokens
    await run(request, tokens.record_use, request.app[TOKENS].take_uses())
    listed = await run(request, tokens.all)
    return json_response({"tokens": [t.to_record().to_wire() for t in listed]})


async def revoke_token(request: web.Request) -> web.Response:
    """Revoke a token by name; it stops working at once."""
    require_admin(request)
    await run(request, request.app[VAULT].tokens.revoke, request.match_info["name"])
    await run(request, refresh_tokens, request.app)
    return web.Response(status=204)


async def audit_log(request: web.Request) -> web.Response:
    """The audit log, newest first; `next` is the `before` cursor of the next page."""
    require_admin(request)
    entries, cursor = await run(
        request,
        request.app[VAULT].audit.entries,
        query_int(request, "limit", 100),
        request.query.get("before"),
    )
    return json_response({"entries": [e.to_wire() for e in entries], "next": cursor})


async def list_uploads(request: web.Request) -> web.Response:
    """Open upload sessions (`?token=NAME` for one token's), with counts per token: who
    is holding the session limit."""
    require_admin(request)
    who = request.query.get("token")
    sessions = await run(request, request.app[VAULT].uploads.open_sessions)
    by_token: dict[str, int] = {}
    for s in sessions:
        by_token[s.created_by or ""] = by_token.get(s.created_by or "", 0) + 1
    shown = [s for s in sessions if who is None or s.created_by == who]
    return json_response(
        {
            "uploads": [
                {
                    "upload_id": s.id,
                    "namespace": s.namespace,
                    "token": s.created_by,
                    "pending_bytes": s.sent_bytes,
                    "created_at": rfc3339(s.created_at),
                    "expires_at": rfc3339(s.expires_at),
                }
                for s in shown
            ],
            "by_token": by_token,
        }
    )


async def abort_upload(request: web.Request) -> web.Response:
    """Abort any open upload session (what its producer's DELETE does)."""
    require_admin(request)
    await run(request, request.app[VAULT].uploads.abort, request.match_info["upload_id"])
    return web.Response(status=204)


def refresh_tokens(app: web.Application) -> None:
    """Reload the in-memory token table after a change."""
    app[TOKENS].reload(app[VAULT].tokens.all())


def add_policy_routes(app: web.Application, ns: str) -> None:
    app.router.add_get(f"/v1/namespaces/{ns}/policy", get_policy)
    app.router.add_put(f"/v1/namespaces/{ns}/policy", put_policy)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/health", health)
    app.router.add_get("/v1/stats", stats)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/admin/gc", gc)
    app.router.add_post("/v1/admin/check", check)
    app.router.add_post("/v1/admin/retention", retention)
    app.router.add_post("/v1/admin/verify", verify)
    app.router.add_post("/v1/admin/compact", compact)
    app.router.add_post("/v1/admin/tiering", tiering)
    app.router.add_post("/v1/admin/catalog/backup", catalog_backup)
    app.router.add_post("/v1/admin/promote", promote)
    app.router.add_get("/v1/policy/default", get_policy)
    app.router.add_put("/v1/policy/default", put_policy)
    app.router.add_post("/v1/admin/tokens", create_token)
    app.router.add_post("/v1/admin/tokens/{name}/rotate", rotate_token)
    app.router.add_get("/v1/admin/uploads", list_uploads)
    app.router.add_get("/v1/admin/audit", audit_log)
    app.router.add_delete("/v1/admin/uploads/{upload_id}", abort_upload)
    app.router.add_get("/v1/admin/tokens", list_tokens)
    app.router.add_delete("/v1/admin/tokens/{name}", revoke_token)
