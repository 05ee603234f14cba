"""What the web console asks that no other route answers: who a token is (so the page offers
only what its scopes allow), and storage samples over time (so it can draw them).

Both work for any token: `whoami` tells a caller only about itself; the history shows vault
totals to admin tokens only (as `GET /v1/stats` does) and, of each sample's namespaces,
only those the token may read.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aiohttp import web

from checkpoint_vault.protocol import StorageSample
from checkpoint_vault.vault import InvalidRequest

from ..auth import principal, require_admin
from ..http import json_response, query_int, run
from ..keys import JOBS, SETTINGS, VAULT


async def whoami(request: web.Request) -> web.Response:
    """The calling token's name and scopes, and whether it is an admin."""
    who = principal(request)
    return json_response({"name": who.name, "scopes": list(who.scopes), "admin": who.is_admin})


def _query_since(request: web.Request) -> float | None:
    raw = request.query.get("since")
    if raw is None:
        return None
    try:
        since = float(raw)
    except ValueError:
        raise InvalidRequest("query parameter since must be epoch seconds") from None
    if not 0 <= since < 1e12:  # also refuses nan and inf
        raise InvalidRequest("query parameter since must be epoch seconds")
    return since


async def stats_history(request: web.Request) -> web.Response:
    """Storage samples (logical, stored, on-disk bytes; per namespace at usage scans),
    oldest first."""
    who = principal(request)
    samples = await run(
        request,
        request.app[VAULT].samples.history,
        since=_query_since(request),
        limit=query_int(request, "limit", 1000),
    )
    out = []
    for s in samples:
        shown = {ns: b for ns, b in s.namespaces.items() if who.may("read", ns)}
        if who.is_admin:
            out.append(replace(s, namespaces=shown).to_wire())
        else:  # vault-wide totals are admin figures (GET /v1/stats)
            out.append(StorageSample(s.at, None, None, None, shown).to_wire())
    interval = request.app[SETTINGS].maintenance.sample_interval
    return json_response({"samples": out, "interval": interval})


async def maintenance_runs(request: web.Request) -> web.Response:
    """Maintenance runs since the server started (scheduled and requested): per job, runs
    by outcome, when the last ended and how long it took, and the totals of its reports."""
    require_admin(request)
    log = request.app[JOBS]
    jobs: dict[str, dict[str, Any]] = {}
    for (job, outcome), n in log.runs.items():
        entry = jobs.setdefault(job, {"ok": 0, "error": 0, "totals": {}})
        entry[outcome] = n
        entry["last_at"] = log.last_at.get(job)
        entry["last_seconds"] = log.last_seconds.get(job)
    longest_first = sorted(jobs, key=len, reverse=True)  # "catalog_backup" before "catalog"
    for key, total in log.totals.items():
        owner = next((j for j in longest_first if key.startswith(j + "_")), None)
        if owner is not None:
            jobs[owner]["totals"][key[len(owner) + 1 :]] = total
    return json_response({"jobs": dict(sorted(jobs.items()))})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/whoami", whoami)
    app.router.add_get("/v1/stats/history", stats_history)
    app.router.add_get("/v1/admin/jobs", maintenance_runs)
