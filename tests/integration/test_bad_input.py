"""Bad input gets its 4xx JSON error and changes nothing."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from yarl import URL

from checkpoint_vault.api import Settings
from checkpoint_vault.vault import FakeClock

from ..conftest import Api, hexhash


async def assert_error(
    api: Api, status: int, code: str, method: str, path: str | URL, **kwargs: Any
) -> dict[str, Any]:
    resp = await api.call(method, str(path) if isinstance(path, str) else path, **kwargs)
    body = await resp.json()
    assert resp.status == status, body
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    return body  # type: ignore[no-any-return]


async def snapshot(api: Api) -> dict[str, Any]:
    stats = await api.json("GET", "/v1/stats")
    stats.pop("map_size")
    listing = await api.json("GET", "/v1/namespaces")
    return {"stats": stats, "namespaces": listing}


@pytest.fixture
async def upload(api: Api) -> str:
    await api.save("ns", {"seed": b"seed bytes"})
    return str((await api.open("ns"))["upload_id"])


async def test_wrong_chunk_hash(api: Api, upload: str) -> None:
    before = await snapshot(api)
    await assert_error(
        api, 400, "hash_mismatch", "PUT", f"/v1/uploads/{upload}/chunks/{hexhash(b'a')}", data=b"b"
    )
    await assert_error(
        api, 400, "invalid_name", "PUT", f"/v1/uploads/{upload}/chunks/NOTHEX", data=b"b"
    )
    assert await snapshot(api) == before


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ({"file": "f"}, "invalid_request"),
        ({"offset": "0"}, "invalid_request"),
        ({"file": "f", "offset": "-1"}, "invalid_request"),
        ({"file": "f", "offset": "x"}, "invalid_request"),
        ({"file": "../f", "offset": "0"}, "invalid_name"),
    ],
)
async def test_bad_batch_position(api: Api, upload: str, query: dict[str, str], code: str) -> None:
    """`?file=&offset=` on a chunk batch: both or neither, a sane name, a count of bytes."""
    before = await snapshot(api)
    data = b"chunk bytes"
    body = bytes.fromhex(hexhash(data)) + len(data).to_bytes(4, "little") + data
    path = URL(f"/v1/uploads/{upload}/chunks").with_query(query)
    await assert_error(
        api,
        400,
        code,
        "POST",
        path,
        data=body,
        headers={"Content-Type": "application/vnd.ckpt.chunks"},
    )
    assert await snapshot(api) == before


async def test_chunk_references_need_a_position(api: Api, upload: str) -> None:
    """A reference record (length 0xFFFFFFFF, no bytes) only says what lies where in a file:
    without `?file=&offset=` the batch is refused whole, its other chunk not stored."""
    before = await snapshot(api)
    data = b"chunk bytes"
    body = bytes.fromhex(hexhash(data)) + len(data).to_bytes(4, "little") + data
    body += bytes.fromhex(hexhash(b"elsewhere")) + (0xFFFF_FFFF).to_bytes(4, "little")
    await assert_error(
        api,
        400,
        "invalid_request",
        "POST",
        f"/v1/uploads/{upload}/chunks",
        data=body,
        headers={"Content-Type": "application/vnd.ckpt.chunks"},
    )
    assert await snapshot(api) == before


async def test_oversize_chunk(api: Api, upload: str) -> None:
    before = await snapshot(api)
    big = os.urandom((1 << 20) + 1)
    await assert_error(
        api, 413, "too_large", "PUT", f"/v1/uploads/{upload}/chunks/{hexhash(big)}", data=big
    )

    async def stream() -> Any:  # no Content-Length: the limit must hold while reading
        for _ in range(3):
            yield big[: 1 << 19]

    await assert_error(
        api, 413, "too_large", "PUT", f"/v1/uploads/{upload}/chunks/{hexhash(big)}", data=stream()
    )
    assert await snapshot(api) == before


async def raw_put(api: Api, raw_path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    """PUT with the path byte-for-byte as given: HTTP client libraries normalize `..`."""
    reader, writer = await api.raw("PUT", raw_path, body, {"Connection": "close"})
    response = await reader.read()
    writer.close()
    await writer.wait_closed()
    status = int(response.split(b" ", 2)[1])
    return status, json.loads(response.split(b"\r\n\r\n", 1)[1])


@pytest.mark.parametrize(
    "name", ["%2E%2E/etc/passwd", "a/%2E%2E/b", "a%00b", "%2Fabs", "a//b", "a/./b", "tab%09name"]
)
async def test_bad_file_names(api: Api, upload: str, name: str) -> None:
    before = await snapshot(api)
    status, body = await raw_put(api, f"/v1/uploads/{upload}/files/{name}", b"x")
    assert (status, body["error"]["code"]) == (400, "invalid_name"), body
    await assert_error(
        api,
        400,
        "invalid_name",
        "POST",
        f"/v1/uploads/{upload}/commit",
        json={
            "files": {
                URL(name, encoded=True).path: {
                    "size": 1,
                    "hash": hexhash(b"x"),
                    "chunks": [hexhash(b"x")],
                }
            }
        },
    )
    assert await snapshot(api) == before


async def test_leading_slash_in_listed_name(api: Api, upload: str) -> None:
    await assert_error(
        api,
        400,
        "invalid_name",
        "POST",
        f"/v1/uploads/{upload}/commit",
        json={"files": {"/etc/x": {"size": 0, "hash": hexhash(b""), "chunks": []}}},
    )


async def test_malformed_json(api: Api, upload: str) -> None:
    before = await snapshot(api)
    for body in [b"{not json", b"[1, 2]", b"\xff\xfe"]:
        await assert_error(
            api,
            400,
            "invalid_request",
            "POST",
            f"/v1/uploads/{upload}/commit",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        await assert_error(
            api, 400, "invalid_request", "POST", "/v1/namespaces/ns2/uploads", data=body
        )
    await assert_error(
        api, 400, "invalid_request", "POST", f"/v1/uploads/{upload}/missing", json={"chunks": "abc"}
    )
    await assert_error(
        api,
        400,
        "invalid_request",
        "POST",
        "/v1/namespaces/ns2/uploads",
        json={"tags": "not-a-list"},
    )
    for tag in ("ok\x1b[31mred", "line\nbreak", "bidi\u202eevil"):  # read back as text
        await assert_error(
            api, 400, "invalid_request", "POST", "/v1/namespaces/ns2/uploads", json={"tags": [tag]}
        )
    await assert_error(
        api,
        400,
        "invalid_request",
        "POST",
        f"/v1/uploads/{upload}/commit",
        json={"files": {"f": {"size": -1, "hash": "0" * 64, "chunks": []}}},
    )
    assert await snapshot(api) == before


async def test_bad_namespace_names(api: Api) -> None:
    before = await snapshot(api)
    for ns in ["-leading-dash", "a" * 129, "/".join("a" * 9), "sp%20ace"]:
        for method, path in (("POST", "uploads"), ("GET", "checkpoints")):
            url = URL(f"/v1/namespaces/{ns}/{path}", encoded=True)
            resp = await api.call(method, url, json={} if method == "POST" else None)
            assert resp.status == 400, (ns, path)
            assert (await resp.json())["error"]["code"] == "invalid_name"
    assert await snapshot(api) == before


async def test_dot_segments_are_refused_not_resolved(api: Api) -> None:
    """HTTP libraries resolve `a/../b` to `b` before sending; a raw request must not act
    on `b` either."""
    before = await snapshot(api)
    for path in ("/v1/namespaces/a/../b/uploads", "/v1/namespaces/a/./b/uploads"):
        reader, writer = await api.raw("POST", path, b"{}", {"Connection": "close"})
        answer = await reader.read()
        writer.close()
        await writer.wait_closed()
        assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
        assert b'"invalid_name"' in answer
    assert await snapshot(api) == before


async def test_unknown_and_expired_uploads(api: Api, upload: str) -> None:
    bogus = "0" * 32
    await assert_error(api, 404, "not_found", "POST", f"/v1/uploads/{bogus}/commit", json={})
    await assert_error(api, 404, "not_found", "PUT", f"/v1/uploads/{bogus}/files/x", data=b"x")
    await assert_error(api, 404, "not_found", "DELETE", f"/v1/uploads/{bogus}")
    await api.call("DELETE", f"/v1/uploads/{upload}", expect=204)
    await assert_error(api, 404, "not_found", "POST", f"/v1/uploads/{upload}/commit", json={})


async def test_references_that_do_not_exist(api: Api) -> None:
    await assert_error(api, 404, "not_found", "GET", "/v1/namespaces/nope/checkpoints/latest")
    await assert_error(api, 404, "not_found", "GET", "/v1/namespaces/nope/checkpoints")
    await api.save("ns", {"f": b"x"})
    await assert_error(api, 404, "not_found", "GET", "/v1/namespaces/ns/checkpoints/01ABC")
    await assert_error(
        api, 404, "not_found", "GET", "/v1/namespaces/ns/checkpoints/latest/files/absent"
    )
    await assert_error(
        api, 404, "not_found", "POST", "/v1/namespaces/ns/uploads", json={"parent": "01NOPE"}
    )
    await assert_error(
        api,
        400,
        "invalid_request",
        "PATCH",
        "/v1/namespaces/ns/checkpoints/latest",
        json={"validity": {"state": "great"}},
    )
    await assert_error(api, 404, "not_found", "GET", "/v1/no/such/route")


async def test_missing_chunks_on_commit(api: Api, upload: str) -> None:
    before = await snapshot(api)
    ghost = hexhash(b"never uploaded")
    body = await assert_error(
        api,
        409,
        "missing_chunks",
        "POST",
        f"/v1/uploads/{upload}/commit",
        json={"files": {"f": {"size": 14, "hash": ghost, "chunks": [ghost]}}},
    )
    assert body["error"]["missing"] == [ghost]
    assert await snapshot(api) == before


async def test_expired_upload_is_410_and_changes_nothing(
    api: Api, upload: str, clock: FakeClock, settings: Settings
) -> None:
    chunk = b"late chunk"
    clock.advance(settings.vault.upload_ttl + 1)
    before = await snapshot(api)
    for method, path, kwargs in [
        ("PUT", f"/v1/uploads/{upload}/chunks/{hexhash(chunk)}", {"data": chunk}),
        ("PUT", f"/v1/uploads/{upload}/files/f", {"data": chunk}),
        ("POST", f"/v1/uploads/{upload}/missing", {"json": {"chunks": [hexhash(chunk)]}}),
        ("POST", f"/v1/uploads/{upload}/commit", {"json": {}}),
    ]:
        await assert_error(api, 410, "upload_expired", method, path, **kwargs)
    assert await snapshot(api) == before
