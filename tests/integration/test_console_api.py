"""The routes the web console adds (issue 34), in process: the page and its files without a
token and with their security headers; `GET /v1/whoami`; `GET /v1/stats/history` (a sample
per usage scan, vault totals for admin only, only readable namespaces); `GET
/v1/admin/jobs`. The page itself is driven in a browser by tests/browser."""

from __future__ import annotations

import asyncio
from typing import Any

from ..conftest import Api

SAMPLE_POLLS = 200  # x SAMPLE_POLL: the server's sampler looks for a new scan once a second
SAMPLE_POLL = 0.05


async def test_page_and_files_need_no_token(api: Api) -> None:
    resp = await api.client.get("/ui/")
    assert resp.status == 200
    assert resp.content_type == "text/html"
    assert "frame-ancestors 'none'" in resp.headers["Content-Security-Policy"]
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    etag = resp.headers["ETag"]
    again = await api.client.get("/ui/", headers={"If-None-Match": etag})
    assert again.status == 304
    js = await api.client.get("/ui/lineage.js")
    assert (js.status, js.content_type) == (200, "text/javascript")
    missing = await api.client.get("/ui/nothing.js")
    assert missing.status == 404
    assert (await missing.json())["error"]["code"] == "not_found"
    moved = await api.client.get("/ui", allow_redirects=False)
    assert (moved.status, moved.headers["Location"]) == (302, "ui/")
    assert (await api.client.get("/v1/whoami")).status == 401  # the API still needs one


async def test_whoami_tells_a_token_its_scopes(api: Api) -> None:
    assert await api.json("GET", "/v1/whoami") == {
        "name": "admin",
        "scopes": ["admin"],
        "admin": True,
    }
    reader = await api.token_for("read:team/*", "write:team/a", name="reader")
    assert await api.json("GET", "/v1/whoami", token=reader) == {
        "name": "reader",
        "scopes": ["read:team/*", "write:team/a"],
        "admin": False,
    }


async def _scanned(api: Api, ns: str) -> list[dict[str, Any]]:
    """Ask for a usage scan, then wait for the sample of it."""
    await api.json("GET", "/v1/stats?namespaces=true")
    for _ in range(SAMPLE_POLLS):
        samples: list[dict[str, Any]] = (await api.json("GET", "/v1/stats/history"))["samples"]
        if any(ns in s["namespaces"] for s in samples):
            return samples
        await asyncio.sleep(SAMPLE_POLL)  # pacing the poll of a condition
    raise AssertionError("no sample after a usage scan")


async def test_history_samples_each_usage_scan_and_shows_only_what_a_token_may_read(
    api: Api,
) -> None:
    await api.save("team/a", {"f": b"a" * 5000})
    await api.save("other", {"f": b"b" * 7000})
    samples = await _scanned(api, "team/a")
    last = samples[-1]
    logical = {ns: b["logical_bytes"] for ns, b in last["namespaces"].items()}
    assert logical == {"other": 7000, "team/a": 5000}
    assert all(b["stored_bytes"] > 0 for b in last["namespaces"].values())
    assert last["logical_bytes"] == 12000
    assert last["disk_bytes"] > 0

    reader = await api.token_for("read:team/*", name="reader")
    seen = (await api.json("GET", "/v1/stats/history", token=reader))["samples"]
    assert len(seen) == len(samples)
    assert seen[-1]["namespaces"].keys() == {"team/a"}
    assert (seen[-1]["logical_bytes"], seen[-1]["stored_bytes"], seen[-1]["disk_bytes"]) == (
        None,
        None,
        None,
    )
    newest = await api.json("GET", f"/v1/stats/history?limit=1&since={last['at']}")
    assert newest["samples"] == [last]
    for bad in ("limit=0", "limit=x", "since=nan", "since=-1", "since=x"):
        await api.call("GET", f"/v1/stats/history?{bad}", expect=400)


async def test_jobs_lists_maintenance_runs_to_admins(api: Api) -> None:
    await api.json("POST", "/v1/admin/gc")
    await api.json("POST", "/v1/admin/gc")
    jobs = (await api.json("GET", "/v1/admin/jobs"))["jobs"]
    assert jobs["gc"]["ok"] == 2
    assert jobs["gc"]["error"] == 0
    assert jobs["gc"]["last_seconds"] >= 0
    assert "chunks_deleted" in jobs["gc"]["totals"]
    reader = await api.token_for("read:*", name="reader")
    await api.call("GET", "/v1/admin/jobs", token=reader, expect=403)
