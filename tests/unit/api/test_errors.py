"""The one error middleware: codes, statuses, Retry-After on 503, no detail on a 500."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from checkpoint_vault.api.errors import error_middleware
from checkpoint_vault.vault.errors import TierUnavailable, TooManyUploads


def app_raising(exc: Exception) -> web.Application:
    async def handler(request: web.Request) -> web.Response:
        raise exc

    app = web.Application(middlewares=[error_middleware])
    app.router.add_get("/", handler)
    return app


async def test_unavailable_says_when_to_retry(aiohttp_client: Any) -> None:
    client = await aiohttp_client(app_raising(TierUnavailable("tier cold: object store down")))
    resp = await client.get("/")
    assert resp.status == 503
    assert int(resp.headers["Retry-After"]) > 0
    assert (await resp.json())["error"]["code"] == "unavailable"


async def test_too_many_uploads_is_429(aiohttp_client: Any) -> None:
    client = await aiohttp_client(app_raising(TooManyUploads("limit")))
    resp = await client.get("/")
    assert resp.status == 429
    assert (await resp.json())["error"]["code"] == "too_many_uploads"


async def test_a_bug_is_500_without_details(aiohttp_client: Any) -> None:
    client = await aiohttp_client(app_raising(ZeroDivisionError("secret /var/lib/path")))
    resp = await client.get("/")
    body = await resp.json()
    assert resp.status == 500
    assert body["error"]["code"] == "internal"
    assert "secret" not in body["error"]["message"]
