"""Metrics change with what the service does; request ids come back on every answer."""

from __future__ import annotations

import re

from checkpoint_vault.protocol import encode_bundle

from ..conftest import Api


def metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.fullmatch(r"([a-z_]+)(?:\{(.*)\})? (\S+)", line)
        if (
            m
            and m.group(1) == name
            and ",".join(sorted((m.group(2) or "").split(",")))
            == (",".join(sorted(want.split(","))))
        ):
            return float(m.group(3))
    return 0.0


async def scrape(api: Api, token: str | None = None) -> str:
    resp = await api.call("GET", "/metrics", token=token, expect=200)
    assert resp.headers["Content-Type"].startswith("text/plain")
    return await resp.text()


async def test_metrics_follow_an_upload(api: Api) -> None:
    before = await scrape(api)
    await api.save("obs/run", {"w": b"weights" * 10_000})
    after = await scrape(api)
    assert metric(after, "ckpt_checkpoints") == metric(before, "ckpt_checkpoints") + 1
    assert metric(after, "ckpt_stored_bytes") > metric(before, "ckpt_stored_bytes")
    route = "/v1/uploads/{upload_id}/commit"
    assert metric(after, "ckpt_http_requests_total", route=route, method="POST", status="201") == 1
    assert metric(after, "ckpt_writer_chunks_written_total") >= 1
    assert metric(after, "ckpt_recovery_point_seconds", namespace="obs/run", which="newest") >= 0
    assert "ckpt_http_request_seconds_bucket" in after
    await api.json("POST", "/v1/admin/gc")
    gc = await scrape(api)
    assert metric(gc, "ckpt_maintenance_runs_total", job="gc", outcome="ok") == 1


async def test_metrics_count_saves_the_journal_acknowledged(api: Api) -> None:
    before = await scrape(api)
    assert metric(before, "ckpt_save_journal_on") == 1
    body = encode_bundle({}, [("state.json", b'{"step": 1}' * 100)])
    await api.call("POST", "/v1/namespaces/obs/agent/checkpoints", data=body, expect=201)
    after = await scrape(api)
    for name in ("journaled_batches", "journal_records"):
        series = f"ckpt_writer_{name}_total"
        assert metric(after, series) == metric(before, series) + 1
    # The record: header, chunk list and the state's one frame, zstd-compressed (1,100 B
    # of a repeated step compress to a few dozen).
    series = "ckpt_writer_journal_bytes_total"
    assert 200 < metric(after, series) - metric(before, series) < 1100


async def test_metrics_need_admin_or_metrics_scope(api: Api) -> None:
    reader = await api.token_for("read:*", name="reader")
    await api.call("GET", "/metrics", token=reader, expect=403)
    monitor = await api.token_for("metrics", name="prometheus")
    assert "ckpt_chunks" in await scrape(api, monitor)


async def test_request_ids_are_returned_and_kept(api: Api) -> None:
    resp = await api.call("GET", "/v1/namespaces", headers={"X-Request-Id": "trace-42"})
    assert resp.headers["X-Request-Id"] == "trace-42"
    resp = await api.call("GET", "/v1/namespaces/none/checkpoints/latest")
    assert resp.status == 404
    assert re.fullmatch(r"[0-9a-f]{16}", resp.headers["X-Request-Id"])
    resp = await api.call("GET", "/v1/namespaces", headers={"X-Request-Id": "bad id\\u00ff"})
    assert resp.headers["X-Request-Id"] != "bad id\\u00ff"
