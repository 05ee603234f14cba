"""Every input through one parser with limits (issue 30, findings 3, 9 and 12), against the
real service: the one-request save's bundle header, durations, sizes and integers in query
strings. Each answered 500, stalled the event loop, or stored an infinity before."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from checkpoint_vault.api import Settings, create_app
from checkpoint_vault.protocol import BUNDLE_HEAD, BUNDLE_MAGIC
from checkpoint_vault.vault import FakeClock

from ..conftest import Api


def bundle(head: bytes, data: bytes = b"") -> bytes:
    """A one-request save body with this header text, byte for byte."""
    return BUNDLE_HEAD.pack(BUNDLE_MAGIC, len(head)) + head + data


async def save(api: Api, body: bytes) -> tuple[int, dict[str, Any]]:
    resp = await api.call("POST", "/v1/namespaces/n/checkpoints", data=body)
    return resp.status, await resp.json()


async def test_a_deep_bundle_header_is_400(api: Api) -> None:
    """Nesting 5,000 deep answered 500 (the header went to a plain `json.loads`)."""
    deep = b'{"files": [], "metadata": {"x": ' + b"[" * 5000 + b"]" * 5000 + b"}}"
    status, body = await save(api, bundle(deep))
    assert status == 400, body
    assert body["error"]["code"] == "invalid_request"
    assert "nested deeper than 64" in body["error"]["message"]
    # brackets inside strings are no nesting: a tag of 100 `[` is a fine tag
    ok, saved = await save(
        api, bundle(b'{"files": [["a", 1]], "tags": ["' + b"[" * 100 + b'"]}', b"x")
    )
    assert ok == 201, saved
    assert saved["tags"] == ["[" * 100]


async def test_numbers_past_a_float_are_400_in_headers_and_bodies(api: Api) -> None:
    """`1e400` parses to infinity, which listings echoed back as `Infinity` (not JSON)."""
    status, body = await save(api, bundle(b'{"files": [], "metadata": {"loss": 1e400}}'))
    assert status == 400, body
    resp = await api.call(
        "POST", "/v1/namespaces/n/uploads", data=b'{"metadata": {"loss": -1e400}}'
    )
    assert resp.status == 400
    assert "too large for a float" in (await resp.json())["error"]["message"]


async def test_a_bundle_header_bomb_is_refused_without_stalling_health(
    aiohttp_client: Any, settings: Settings, clock: FakeClock
) -> None:
    """An 8 MiB header of `[],` blocked health 3.2 s (+156 MB); a header past the JSON body
    limit was accepted up to the 64 MiB batch limit. Both are 413 now, health stays fast."""
    small = dataclasses.replace(settings, max_json_body=1 << 20)
    client = await aiohttp_client(create_app(small, clock))
    api = Api(client, (settings.data_dir / "admin.token").read_text().strip(), settings.data_dir)
    bomb = bundle(b'{"files": [], "x": [' + b"[]," * ((8 << 20) // 3) + b"[]]}")
    # valid JSON of few containers, but 2 MiB: past the 1 MiB JSON limit set above
    wide = bundle(b'{"files": [], "metadata": {"x": "' + b"a" * (2 << 20) + b'"}}')

    async def flood() -> list[int]:
        codes = []
        for body in (bomb, wide) * 2:
            status, answer = await save(api, body)
            assert answer["error"]["code"] == "too_large", answer
            codes.append(status)
        return codes

    codes, worst = await asyncio.gather(flood(), api.worst_health())
    assert codes == [413, 413] * 2
    assert worst < 1.0, f"health took {worst:.3f} s during the flood"


async def test_durations_are_finite_and_bounded(api: Api) -> None:
    """`10^400` seconds became infinity: the token listing emitted `Infinity`, a rotated
    secret never expired, a `keep_within` of inf broke retention for every namespace."""
    for expires in ("1e400s", "1" + "0" * 400 + "s", "1" + "0" * 40 + "s", "101w" * 1):
        resp = await api.call(
            "POST", "/v1/admin/tokens", json={"name": "t", "scopes": ["read:a"], "expires": expires}
        )
        if expires == "101w":  # two years: fine
            assert resp.status == 201, await resp.text()
            continue
        assert resp.status == 400, (expires, await resp.text())
    raw = b'{"name": "u", "scopes": ["read:a"], "expires": 1e400}'
    resp = await api.call("POST", "/v1/admin/tokens", data=raw)
    assert resp.status == 400
    resp = await api.call("POST", "/v1/admin/tokens/t/rotate", json={"grace": "9" * 30 + "d"})
    assert resp.status == 400, await resp.text()
    for keep in ("1" + "0" * 400 + "s", "5000000w", 10**400):
        resp = await api.call("PUT", "/v1/policy/default", json={"keep_within": keep})
        assert resp.status == 400, (keep, await resp.text())
    listing = await (await api.call("GET", "/v1/admin/tokens", expect=200)).text()
    json.loads(listing, parse_constant=lambda name: 1 / 0)  # strict JSON: no Infinity


async def test_huge_numbers_in_query_strings_are_400(api: Api) -> None:
    """`compact?rate=` with 400 digits answered 500 (overflow turning it into a float)."""
    for path in (
        "/v1/admin/compact?rate=" + "9" * 400,
        "/v1/admin/compact?rate=" + "9" * 30 + "TiB",
        "/v1/namespaces/n/checkpoints?limit=" + "9" * 400,
        "/v1/namespaces/n/checkpoints?limit=-1",
    ):
        method = "POST" if "compact" in path else "GET"
        resp = await api.call(method, path)
        assert resp.status == 400, (path, await resp.text())
        assert (await resp.json())["error"]["code"] == "invalid_request"


async def test_a_star_before_a_segment_is_warned_about(api: Api) -> None:
    """`read:*/secret` matches `x/y/secret` (fnmatch's `*` crosses `/`): said, not refused."""
    issued = await api.json(
        "POST", "/v1/admin/tokens", expect=201, json={"name": "w", "scopes": ["read:*/secret"]}
    )
    assert any("x/y/secret" in w for w in issued["warnings"]), issued["warnings"]
    plain = await api.json(
        "POST", "/v1/admin/tokens", expect=201, json={"name": "p", "scopes": ["read:team/*"]}
    )
    assert not plain.get("warnings")


async def test_huge_integers_in_bodies_are_400(api: Api) -> None:
    """JSON integers have no bound in Python: each numeric field is range-checked."""
    huge = 10**400
    for body in (
        {"keep_last": huge},
        {"keep_last": -1},
        {"keep_within": huge},
    ):
        resp = await api.call("PUT", "/v1/policy/default", json=body)
        assert resp.status == 400, (body, await resp.text())
    up = await api.open("n")
    commit = {"files": {"a": {"size": huge, "chunks": []}}}
    resp = await api.call("POST", f"/v1/uploads/{up['upload_id']}/commit", json=commit)
    assert resp.status in (400, 413), await resp.text()
