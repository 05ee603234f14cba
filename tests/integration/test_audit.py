"""The audit log (issue 16): every state-changing admin, delete, pin, validity and policy
action is recorded with token name, what, when and request id; refusals are not."""

from __future__ import annotations

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
        expected.append((method, path, resp.headers["X-Request-Id"]))
    await api.call("PATCH", base, token=writer, json={"tags": []}, expect=404)  # deleted
    await api.call("POST", "/v1/admin/gc", token=ops, expect=403)  # refused: not recorded
    log = await api.json("GET", "/v1/admin/audit?limit=100")
    entries = list(reversed(log["entries"]))  # oldest first
    mine = [e for e in entries if e["action"] != "POST /v1/admin/tokens"]
    assert [(e["action"].split()[0], e["target"], e["request_id"]) for e in mine] == expected
    assert [e["token"] for e in mine] == ["ops", "ops", "ops", "admin", "admin", "ops"]
    assert mine[0]["details"] == {"validity": {"state": "invalid", "reason": "nan"}}
    assert mine[0]["action"] == "PATCH /v1/namespaces/{ns}/checkpoints/{ref}"
    created = [e for e in entries if e["action"] == "POST /v1/admin/tokens"]
    assert [e["details"]["name"] for e in created] == ["ops", "writer"]
    assert "ckpt_" not in str(log)  # a token's secret is only in the creating answer
    page = await api.json("GET", "/v1/admin/audit?limit=3")
    rest = await api.json("GET", f"/v1/admin/audit?limit=100&before={page['next']}")
    assert page["entries"] + rest["entries"] == log["entries"]
    assert rest["next"] is None
    await api.call("GET", "/v1/admin/audit", token=ops, expect=403)
