"""`POST /v1/commits` on one node: several namespaces committed in one writer transaction,
all or nothing, a retry returning the same checkpoints; the token must write every one."""

from __future__ import annotations

from typing import Any

from ..conftest import Api


async def _staged(api: Api, ns: str, data: bytes) -> str:
    """An upload of `ns` holding one streamed file, not committed."""
    up = await api.open(ns)
    await api.json("PUT", f"/v1/uploads/{up['upload_id']}/files/state.bin", expect=201, data=data)
    return str(up["upload_id"])


async def _latest(api: Api, ns: str) -> int:
    resp = await api.call("GET", f"/v1/namespaces/{ns}/checkpoints/latest")
    return resp.status


async def test_all_committed_in_one_call_and_retry_returns_them(api: Api) -> None:
    names = ["agents/planner", "agents/coder", "pipeline"]
    commits = [
        {"namespace": ns, "upload_id": await _staged(api, ns, ns.encode() * 100)} for ns in names
    ]
    body: dict[str, Any] = {"transaction": "ab" * 16, "commits": commits}
    first = await api.json("POST", "/v1/commits", expect=201, json=body)
    assert first["transaction"] == "ab" * 16
    assert [c["namespace"] for c in first["checkpoints"]] == names
    for ns, rec in zip(names, first["checkpoints"], strict=True):
        assert await api.read(ns, rec["id"], "state.bin") == ns.encode() * 100
    again = await api.json("POST", "/v1/commits", expect=200, json=body)
    assert [c["id"] for c in again["checkpoints"]] == [c["id"] for c in first["checkpoints"]]


async def test_one_bad_upload_makes_nothing_visible(api: Api) -> None:
    good = [await _staged(api, ns, b"x" * 5000) for ns in ("a1", "a2")]
    bad = await api.open("a3")
    missing = "0" * 64
    commits: list[dict[str, Any]] = [
        {"namespace": ns, "upload_id": u} for ns, u in zip(("a1", "a2"), good, strict=True)
    ]
    commits.append(
        {
            "namespace": "a3",
            "upload_id": bad["upload_id"],
            "files": {"f": {"size": 10, "chunks": [missing]}},
        }
    )
    resp = await api.call("POST", "/v1/commits", json={"commits": commits})
    answer = await resp.json()
    assert resp.status == 409, answer
    assert answer["error"]["code"] == "missing_chunks"
    assert "'a3'" in answer["error"]["message"]  # says which namespace was refused
    assert answer["error"]["missing"] == [missing]
    for ns in ("a1", "a2", "a3"):
        assert await _latest(api, ns) == 404
    # the good uploads are still open: committed alone, they work
    for ns, u in zip(("a1", "a2"), good, strict=True):
        rec = await api.json("POST", f"/v1/uploads/{u}/commit", expect=201, json={})
        assert rec["namespace"] == ns


async def test_token_must_write_every_namespace(api: Api) -> None:
    token = await api.token_for("write:mine/*", "read:mine/*")
    mine = await _staged(api, "mine/a", b"m" * 100)
    other = await _staged(api, "theirs", b"t" * 100)
    commits = [
        {"namespace": "mine/a", "upload_id": mine},
        {"namespace": "theirs", "upload_id": other},
    ]
    resp = await api.call("POST", "/v1/commits", json={"commits": commits}, token=token)
    assert resp.status == 403
    # an upload named under a namespace it does not belong to is refused too
    commits[1]["namespace"] = "mine/b"
    resp = await api.call("POST", "/v1/commits", json={"commits": commits}, token=token)
    assert resp.status == 409, await resp.text()
    assert await _latest(api, "mine/a") == 404
