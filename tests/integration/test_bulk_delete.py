"""DELETE /v1/namespaces/{ns}/checkpoints: many checkpoints in one request, and a namespace
emptied by deletes leaving the namespace list."""

from __future__ import annotations

from typing import Any

from ..conftest import Api


async def _names(api: Api) -> set[str]:
    return {n["name"] for n in (await api.json("GET", "/v1/namespaces"))["namespaces"]}


async def _live(api: Api, ns: str) -> list[str]:
    listed = await api.json("GET", f"/v1/namespaces/{ns}/checkpoints")
    return [r["id"] for r in listed["checkpoints"]]


async def test_deleting_a_whole_namespace_in_one_request(api: Api) -> None:
    ids = [(await api.save("t/1", {"f": bytes([i]) * 3000}))["id"] for i in range(5)]
    await api.save("t/2", {"f": b"other"})
    await api.json("PATCH", f"/v1/namespaces/t/1/checkpoints/{ids[1]}", json={"pinned": True})
    await api.call("DELETE", "/v1/namespaces/t/1/checkpoints", expect=400)  # says nothing
    await api.call("DELETE", "/v1/namespaces/t/1/checkpoints", json={"ids": None}, expect=400)
    out: dict[str, Any] = await api.json(
        "DELETE", "/v1/namespaces/t/1/checkpoints", json={"all": True}
    )
    assert sorted(out["deleted"]) == sorted(ids[:1] + ids[2:])
    assert out["pinned"] == [ids[1]]
    assert out["not_found"] == []
    assert await _live(api, "t/1") == [ids[1]]
    assert await _names(api) == {"t/1", "t/2"}  # a pinned checkpoint keeps it listed
    await api.json("PATCH", f"/v1/namespaces/t/1/checkpoints/{ids[1]}", json={"pinned": False})
    again = await api.json("DELETE", "/v1/namespaces/t/1/checkpoints", json={"all": True})
    assert again == {"deleted": [ids[1]], "pinned": [], "not_found": []}
    assert await _names(api) == {"t/2"}
    lineage = await api.json("GET", "/v1/namespaces/t/2/checkpoints/latest/lineage")
    assert len(lineage["chain"]) == 1
    check = await api.json("POST", "/v1/admin/check")
    assert check["ok"] is True
    assert check["checkpoints"] == 1
    refilled = await api.save("t/1", {"f": b"back"})
    assert await _names(api) == {"t/1", "t/2"}
    assert await _live(api, "t/1") == [refilled["id"]]


async def test_deleting_listed_ids_reports_the_ones_already_gone(api: Api) -> None:
    a = (await api.save("t/3", {"f": b"a"}))["id"]
    b = (await api.save("t/3", {"f": b"b"}))["id"]
    await api.call("DELETE", f"/v1/namespaces/t/3/checkpoints/{a}", expect=204)
    out = await api.json(
        "DELETE",
        "/v1/namespaces/t/3/checkpoints",
        json={"ids": [a, b, "01NOPE0000000000000000000"]},
    )
    assert out == {"deleted": [b], "pinned": [], "not_found": [a, "01NOPE0000000000000000000"]}
    assert await _live(api, "t/3") == []


async def test_bulk_delete_needs_the_delete_scope_and_sane_input(api: Api) -> None:
    await api.save("t/4", {"f": b"a"})
    writer = await api.token_for("write:t/*", "read:t/*")
    await api.call("DELETE", "/v1/namespaces/t/4/checkpoints", token=writer, expect=403)
    await api.call("DELETE", "/v1/namespaces/t/4/checkpoints", json={"ids": "x"}, expect=400)
    await api.call("DELETE", "/v1/namespaces/t/4/checkpoints", json={"ids": [1]}, expect=400)
    await api.call("DELETE", "/v1/namespaces/nope/checkpoints", json={"all": True}, expect=404)
    assert len(await _live(api, "t/4")) == 1


async def test_the_bulk_delete_is_in_the_openapi_document(api: Api) -> None:
    doc = await api.json("GET", "/v1/openapi.json")
    op = doc["paths"]["/v1/namespaces/{ns}/checkpoints"]["delete"]
    assert op["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/BulkDeleted"
    }
    assert doc["components"]["schemas"]["BulkDeleted"]["required"] == [
        "deleted",
        "pinned",
        "not_found",
    ]
