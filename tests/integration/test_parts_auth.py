"""Parts through the HTTP API of one server (in process): a token that may write a
namespace saves its parts (the upload routes check the part's namespace, not `_parts`),
commits them once, and sees only what a write token sees; a token of another namespace is
refused at every step; a part's upload cannot be committed as a plain upload."""

from __future__ import annotations

from typing import Any

from ..conftest import Api


async def _part(api: Api, token: str, ns: str, files: dict[str, bytes]) -> dict[str, Any]:
    up = await api.json("POST", "/v1/parts", expect=201, json={"namespace": ns}, token=token)
    assert up["namespace"] == ns
    for name, data in files.items():
        path = f"/v1/uploads/{up['upload_id']}/files/{name}"
        await api.call("PUT", path, token=token, data=data, expect=201)
    part: dict[str, Any] = await api.json(
        "POST", f"/v1/uploads/{up['upload_id']}/part", expect=201, json={}, token=token
    )
    return part


async def test_a_write_token_saves_and_commits_its_parts_and_no_other_may(api: Api) -> None:
    writer = await api.token_for("write:job/*", name="writer")
    other = await api.token_for("write:else/*", name="other")
    a = await _part(api, writer, "job/1", {"a.bin": b"A" * 70_000})
    b = await _part(api, writer, "job/1", {"b.bin": b"B" * 9_000})
    assert (a["node"], a["files"], a["size"]) == ("", ["a.bin"], 70_000)

    # another namespace's token: refused opening, reading, shipping, releasing, committing
    await api.call("POST", "/v1/parts", json={"namespace": "job/1"}, token=other, expect=403)
    await api.call("GET", f"/v1/parts/{a['id']}", token=other, expect=403)
    await api.call("DELETE", f"/v1/parts/{a['id']}", token=other, expect=403)
    refs = {"parts": [{"node": "", "id": a["id"]}, {"node": "", "id": b["id"]}]}
    await api.call("POST", "/v1/namespaces/job/1/parts", json=refs, token=other, expect=403)
    # the same parts by another token that may write the namespace: not its parts
    twin = await api.token_for("write:job/*", name="twin")
    await api.call("POST", "/v1/namespaces/job/1/parts", json=refs, token=twin, expect=400)
    # the reserved namespace is no one's to read
    await api.call("GET", "/v1/namespaces/_parts/checkpoints", expect=400)

    written = await api.json(
        "POST", "/v1/namespaces/job/1/parts", expect=201, json=refs, token=writer
    )
    assert set(written) == {"id", "namespace"}  # a write-only token learns only what it wrote
    listed = await api.json("GET", "/v1/namespaces/job/1/checkpoints")
    assert [c["id"] for c in listed["checkpoints"]] == [written["id"]]
    assert sorted(listed["checkpoints"][0]["files"]) == ["a.bin", "b.bin"]
    assert await api.read("job/1", written["id"], "a.bin") == b"A" * 70_000
    names = await api.json("GET", "/v1/namespaces")
    assert [n["name"] for n in names["namespaces"]] == ["job/1"]


async def test_a_parts_upload_is_not_committed_as_a_plain_one(api: Api) -> None:
    up = await api.json("POST", "/v1/parts", expect=201, json={"namespace": "job/2"})
    await api.call("POST", f"/v1/uploads/{up['upload_id']}/commit", json={}, expect=409)
    plain = await api.open("job/2")
    await api.call("POST", f"/v1/uploads/{plain['upload_id']}/part", json={}, expect=409)
