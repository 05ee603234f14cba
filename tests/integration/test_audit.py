"""The audit log (issue 16): every state-changing admin, delete, pin, validity and policy
action is recorded with token name, what, when and request id; refusals are not. Issue 30:
bulk deletes too (finding 4), entries keep the route and its parameters, not the raw query,
and the log is pruned by age and size (finding 6)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from aiohttp.test_utils import TestClient

from checkpoint_vault.api import Settings, create_app
from checkpoint_vault.api.keys import VAULT
from checkpoint_vault.protocol import encode_bundle
from checkpoint_vault.vault import FakeClock

from ..conftest import Api


async def test_each_action_is_recorded_with_who_and_request_id(api: Api) -> None:
    rec = await api.save("team/run", {"f": b"x"})
    ops = await api.token_for("read:team/*", "write:team/*", "delete:team/*", name="ops")
    writer = await api.token_for("write:team/*", name="writer")
    base = f"/v1/namespaces/team/run/checkpoints/{rec['id']}"
    expected = []
    for method, path, body, token in [
        ("PATCH", base, {"validity": {"state": "invalid", "reason": "nan"}}, ops),
        ("PATCH", base, {"pinned": True}, ops),
        ("PATCH", base, {"pinned": False}, ops),
        ("PUT", "/v1/namespaces/team/run/policy", {"retention": {"keep_last": 3}}, None),
        ("POST", "/v1/admin/gc?dry_run=true", None, None),
        ("DELETE", base, None, ops),
    ]:
        resp = await api.call(method, path, json=body, token=token)
        assert resp.status < 300, await resp.text()
        expected.append((method, path.split("?")[0], resp.headers["X-Request-Id"]))
    await api.call("PATCH", base, token=writer, json={"tags": []}, expect=404)  # deleted
    await api.call("POST", "/v1/admin/gc", token=ops, expect=403)  # refused: not recorded
    log = await api.json("GET", "/v1/admin/audit?limit=100")
    entries = list(reversed(log["entries"]))  # oldest first
    mine = [e for e in entries if e["action"] != "POST /v1/admin/tokens"]
    assert [(e["action"].split()[0], e["target"], e["request_id"]) for e in mine] == expected
    assert [e["token"] for e in mine] == ["ops", "ops", "ops", "admin", "admin", "ops"]
    assert mine[0]["details"] == {"validity": {"state": "invalid", "reason": "nan"}}
    assert mine[0]["action"] == "PATCH /v1/namespaces/{ns}/checkpoints/{ref}"
    assert mine[0]["route"] == "/v1/namespaces/{ns}/checkpoints/{ref}"
    assert mine[4]["params"] == {"dry_run": "true"}
    created = [e for e in entries if e["action"] == "POST /v1/admin/tokens"]
    assert [e["details"]["name"] for e in created] == ["ops", "writer"]
    assert "ckpt_" not in str(log)  # a token's secret is only in the creating answer
    page = await api.json("GET", "/v1/admin/audit?limit=3")
    rest = await api.json("GET", f"/v1/admin/audit?limit=100&before={page['next']}")
    assert page["entries"] + rest["entries"] == log["entries"]
    assert rest["next"] is None
    await api.call("GET", "/v1/admin/audit", token=ops, expect=403)


async def test_a_bulk_delete_is_recorded_with_the_ids_it_deleted(api: Api) -> None:
    """Finding 4: `DELETE .../checkpoints` (ids or all) wrote no entry; a single one did."""
    a, b, c, d = [(await api.save("bulk/run", {"f": bytes([i])}))["id"] for i in range(4)]
    ops = await api.token_for("read:bulk/*", "write:bulk/*", "delete:bulk/*", name="ops")
    base = "/v1/namespaces/bulk/run/checkpoints"
    await api.call("PATCH", f"{base}/{b}", json={"pinned": True}, expect=200)
    ghost = "0" * 26
    done = await api.json("DELETE", base, token=ops, json={"ids": [a, b, ghost]})
    assert done == {"deleted": [a], "pinned": [b], "not_found": [ghost]}
    await api.json("DELETE", base, token=ops, json={"all": True})
    await api.call("DELETE", base, token=ops, json={"nothing": 1}, expect=400)  # not recorded
    log = await api.json("GET", "/v1/admin/audit?limit=2")
    everything, some = log["entries"]  # newest first
    for e in (some, everything):
        assert e["action"] == "DELETE /v1/namespaces/{ns}/checkpoints"
        assert e["target"] == base
        assert e["token"] == "ops"
    assert some["details"] == {
        "all": False, "deleted": [a], "deleted_count": 1, "pinned_count": 1,
        "not_found_count": 1,
    }  # fmt: skip
    assert everything["details"]["all"] is True
    assert sorted(everything["details"]["deleted"]) == sorted([c, d])
    assert everything["details"]["pinned_count"] == 1


async def test_an_entry_keeps_the_route_and_its_parameters_not_the_raw_query(api: Api) -> None:
    """Finding 6: an entry kept the whole path and query (7 KB of whatever a client sent)."""
    rec = await api.save("q/run", {"f": b"x"})
    pad = "x" * 7000
    await api.call("POST", f"/v1/admin/gc?dry_run=true&pad={pad}", expect=200)
    path = f"/v1/namespaces/q/run/checkpoints/{rec['id']}"
    await api.call("DELETE", f"{path}?pad={pad}", expect=204)
    await api.call("POST", f"/v1/admin/retention?namespace=q/run&pad={pad}", expect=200)
    retention, delete, gc = (await api.json("GET", "/v1/admin/audit?limit=3"))["entries"]
    assert gc["target"] == "/v1/admin/gc"
    assert gc["route"] == "/v1/admin/gc"
    assert gc["params"] == {"dry_run": "true"}
    assert delete["target"] == path
    assert delete["params"] == {}
    assert retention["params"] == {"namespace": "q/run"}
    for e in (gc, delete, retention):
        assert len(json.dumps(e)) < 1000, e


def _bounded(settings: Settings, max_age: float, max_bytes: int) -> Settings:
    return replace(
        settings, vault=replace(settings.vault, audit_max_age=max_age, audit_max_bytes=max_bytes)
    )


async def _api_with(aiohttp_client: Any, settings: Settings, clock: FakeClock) -> Api:
    client: TestClient[Any, Any] = await aiohttp_client(create_app(settings, clock))
    token = (settings.data_dir / "admin.token").read_text().strip()
    return Api(client, token, settings.data_dir)


async def test_entries_older_than_max_age_are_pruned_as_entries_are_appended(
    aiohttp_client: Any, settings: Settings, clock: FakeClock
) -> None:
    api = await _api_with(aiohttp_client, _bounded(settings, 3600.0, 0), clock)
    for _ in range(3):
        await api.call("POST", "/v1/admin/gc?dry_run=true", expect=200)
    clock.advance(1800.0)
    fresh = await api.call("POST", "/v1/admin/gc?dry_run=true", expect=200)
    assert len((await api.json("GET", "/v1/admin/audit"))["entries"]) == 4
    clock.advance(1801.0)  # the first three are now older than an hour
    last = await api.call("POST", "/v1/admin/gc?dry_run=true", expect=200)
    kept = (await api.json("GET", "/v1/admin/audit"))["entries"]
    assert [e["request_id"] for e in kept] == [
        last.headers["X-Request-Id"], fresh.headers["X-Request-Id"]
    ]  # fmt: skip


async def test_the_log_stays_within_max_bytes(
    aiohttp_client: Any, settings: Settings, clock: FakeClock
) -> None:
    bound = 32 << 10
    api = await _api_with(aiohttp_client, _bounded(settings, 0, bound), clock)
    audit = api.client.app[VAULT].audit
    rec = await api.save("size/run", {"f": b"x"})
    path = f"/v1/namespaces/size/run/checkpoints/{rec['id']}"
    ids = []
    for i in range(300):  # ~400 bytes each: ~120 KB unpruned
        clock.advance(1.0)
        resp = await api.call("PATCH", path, json={"tags": [f"t{i}"]}, expect=200)
        ids.append(resp.headers["X-Request-Id"])
        assert audit.usage()[1] <= bound
    entries, size = audit.usage()
    assert 40 < entries < 300
    kept = (await api.json("GET", "/v1/admin/audit?limit=1000"))["entries"]
    assert [e["request_id"] for e in reversed(kept)] == ids[-entries:]  # the newest, in order


async def test_a_token_flooding_the_log_ages_out_its_own_entries_not_others(
    aiohttp_client: Any, settings: Settings, clock: FakeClock
) -> None:
    """Past `max_bytes` the oldest entries of the token holding the most bytes go: a write
    token PATCHing in a loop cannot erase what the admin did (it could before)."""
    bound = 32 << 10
    api = await _api_with(aiohttp_client, _bounded(settings, 0, bound), clock)
    made = await api.json(
        "POST",
        "/v1/admin/tokens",
        expect=201,
        json={"name": "flood", "scopes": ["write:*", "delete:*"]},
    )
    admin_ids = []
    for _ in range(5):
        clock.advance(1.0)
        resp = await api.call("POST", "/v1/admin/gc?dry_run=true", expect=200)
        admin_ids.append(resp.headers["X-Request-Id"])
    body = encode_bundle({}, [("f", b"x")])
    rec = await api.json(
        "POST", "/v1/namespaces/flood/run/checkpoints", expect=201, token=made["token"], data=body
    )
    path = f"/v1/namespaces/flood/run/checkpoints/{rec['id']}"
    for i in range(300):  # ~400 bytes each: the log is pruned for most of them
        clock.advance(1.0)
        await api.call("PATCH", path, token=made["token"], json={"tags": [f"t{i}"]}, expect=200)
    audit = api.client.app[VAULT].audit
    assert audit.usage()[1] <= bound
    kept = (await api.json("GET", "/v1/admin/audit?limit=1000"))["entries"]
    assert {e["request_id"] for e in kept} >= set(admin_ids)  # every admin entry stays
    assert sum(e["token"] == "flood" for e in kept) < 300  # the flood's own went
