"""Characters that are not shown as themselves (issue 41, low): tags may not hold invisible
or line-separating characters, file names no bidi override, zero-width or line separator,
on every way in (upload, one-request save, change, fork); names and tags that were valid and
readable still are. The rule is protocol/_text.py's."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from yarl import URL

from checkpoint_vault.protocol import BUNDLE_TYPE, encode_bundle

from ..conftest import Api

HIDDEN = ["\u2028", "\u2029", "\u200b", "\ufeff", "\xad", "\u202e", "\u2066", "\x85"]
READABLE_TAGS = ["release-1", "étape 3", "模型 v2", "👩\u200d🔬", "a b", "x" * 128]
READABLE_NAMES = ["dir/état.json", "模型/权重.bin", "👩\u200d🔬.txt", "a b.txt", "\ue000"]


async def _status(api: Api, method: str, path: str | URL, **kwargs: Any) -> tuple[int, str]:
    resp = await api.call(method, path, **kwargs)
    body = await resp.json()
    return resp.status, "" if resp.status < 300 else body["error"]["code"]


def _bundle(header: dict[str, Any], name: str = "state") -> dict[str, Any]:
    return {
        "data": encode_bundle(header, [(name, b"x")]),
        "headers": {"Content-Type": BUNDLE_TYPE},
    }


async def test_hidden_characters_in_tags_are_refused_everywhere(api: Api) -> None:
    made = await api.save("ns", {"f": b"one"})
    ref = f"/v1/namespaces/ns/checkpoints/{made['id']}"
    for ch in HIDDEN:
        tag = f"prod{ch}"
        assert await _status(api, "POST", "/v1/namespaces/ns/uploads", json={"tags": [tag]}) == (
            400,
            "invalid_request",
        ), repr(ch)
        saved = await _status(
            api, "POST", "/v1/namespaces/ns/checkpoints", **_bundle({"tags": [tag]})
        )
        assert saved == (400, "invalid_request"), repr(ch)
        assert await _status(api, "PATCH", ref, json={"tags": [tag]}) == (
            400,
            "invalid_request",
        ), repr(ch)
        forked = await _status(api, "POST", f"{ref}/fork", json={"namespace": "x", "tags": [tag]})
        assert forked == (400, "invalid_request"), repr(ch)
    resp = await api.call("POST", "/v1/namespaces/ns/uploads", json={"tags": ["a\u2028b"]})
    assert "U+2028" in (await resp.json())["error"]["message"]
    listed = await api.json("GET", "/v1/namespaces/ns/checkpoints")
    assert [c["tags"] for c in listed["checkpoints"]] == [[]]


async def test_readable_tags_are_kept(api: Api) -> None:
    up = await api.open("ns", tags=READABLE_TAGS)
    made = await api.json("POST", f"/v1/uploads/{up['upload_id']}/commit", 201, json={})
    assert made["tags"] == READABLE_TAGS


async def test_hidden_characters_in_file_names_are_refused(api: Api) -> None:
    up = await api.open("ns")
    for ch in HIDDEN:
        name = f"evil{ch}txt.exe"
        put = await _status(
            api,
            "PUT",
            URL(f"/v1/uploads/{up['upload_id']}/files/{quote(name)}", encoded=True),
            data=b"x",
        )
        assert put == (400, "invalid_name"), repr(ch)
        saved = await _status(api, "POST", "/v1/namespaces/ns/checkpoints", **_bundle({}, name))
        assert saved == (400, "invalid_name"), repr(ch)
        files = {
            name: {
                "size": 0,
                "hash": "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262",
                "chunks": [],
            }
        }
        committed = await _status(
            api, "POST", f"/v1/uploads/{up['upload_id']}/commit", json={"files": files}
        )
        assert committed == (400, "invalid_name"), repr(ch)
    for name in READABLE_NAMES:
        await api.json(
            "PUT",
            URL(f"/v1/uploads/{up['upload_id']}/files/{quote(name)}", encoded=True),
            201,
            data=b"x",
        )
    made = await api.json("POST", f"/v1/uploads/{up['upload_id']}/commit", 201, json={})
    assert sorted(made["files"]) == sorted(READABLE_NAMES)
