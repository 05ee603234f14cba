"""The one retry policy: what it retries, how long it waits, when it stops."""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from checkpoint_vault.client import NotFound, RetryPolicy, ServerError, TransportError, Unavailable
from checkpoint_vault.client.connections import Broken
from checkpoint_vault.client.errors import error_from
from checkpoint_vault.client.transport import Transport, _retry_after, retryable

ServerFactory = Callable[[web.Application], Awaitable[TestServer]]
FAST = RetryPolicy(attempts=4, base=0.001, cap=0.002)
Ask = Callable[[Transport, str], Awaitable[Any]]


async def _on_the_loop(t: Transport, path: str) -> Any:
    return await t.json("POST", path, data=b"{}", headers={})


async def _on_a_blocked_thread(t: Transport, path: str) -> Any:
    """`json_here`, as a blocked caller (`VaultClient.save`) runs it: on its own thread."""
    return await asyncio.to_thread(t.json_here, "POST", path, data=b"{}", headers={})


async def _prepared(t: Transport, path: str) -> Any:
    """`send_here` of a request prepared once (a namespace's one-request saves)."""
    request = t.prepare("POST", path, {})
    return await asyncio.to_thread(t.send_here, request, [b"{}"])


@pytest.fixture(
    params=[_on_the_loop, _on_a_blocked_thread, _prepared], ids=["loop", "caller", "prepared"]
)
def ask(request: pytest.FixtureRequest) -> Ask:
    """Every way a request is made: the retries, errors and counts must be the same."""
    return request.param  # type: ignore[no-any-return]


def _error(status: int, retry_after: float | None = None) -> Exception:
    error = error_from(status, None)
    error.retry_after = retry_after
    return error


def test_what_is_retried() -> None:
    assert retryable(Broken("the connection was reset"))
    for status in (502, 503, 504):
        assert retryable(_error(status))
    assert retryable(_error(429, 1.0))
    assert not retryable(_error(429))  # no Retry-After: it does not say it will pass
    assert not retryable(_error(404))
    assert not retryable(_error(500))
    assert not retryable(ValueError())


def test_waits_are_jittered_bounded_and_obey_retry_after() -> None:
    policy = RetryPolicy(attempts=3, base=1.0, cap=2.0, deadline=10.0, retry_after_limit=5.0)
    waits = [policy.wait(1, 0.0, None) for _ in range(200)]
    assert all(w is not None and 0 <= w <= 2.0 for w in waits)
    assert len(set(waits)) > 100  # full jitter, not a fixed ladder
    assert policy.wait(0, 0.0, 4.0) == pytest.approx(4.0, abs=1.0)
    assert (policy.wait(0, 0.0, 4.0) or 0) >= 4.0
    assert policy.wait(0, 0.0, 6.0) is None  # asks longer than we wait: fail now
    assert policy.wait(2, 0.0, None) is None  # out of attempts
    assert policy.wait(0, 9.5, 1.0) is None  # would pass the deadline


def test_retry_after_reads_seconds_and_dates() -> None:
    assert _retry_after({"Retry-After": "3"}) == 3.0
    assert _retry_after({}) is None
    assert _retry_after({"Retry-After": "soon"}) is None
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 < (_retry_after({"Retry-After": later}) or 0) <= 30


def test_retry_after_behind_a_proxy_that_lowercases_header_names() -> None:
    """HAProxy 2 (and any HTTP/2 hop) sends `retry-after`: a cluster's 503s while a shard
    changes hands must still pace the client's retries (tests/fault/test_cluster_*)."""
    assert _retry_after({"retry-after": "2"}) == 2.0
    assert _retry_after({"RETRY-AFTER": "1"}) == 1.0


async def _serve(
    aiohttp_server: ServerFactory, answers: list[tuple[int, dict[str, str]]]
) -> tuple[TestServer, list[int]]:
    """A server that gives `answers` in turn, then 200 {"ok": true}; counts requests."""
    seen: list[int] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(1)
        if answers:
            status, headers = answers.pop(0)
            return web.json_response(
                {"error": {"code": "x", "message": "no"}}, status=status, headers=headers
            )
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    return await aiohttp_server(app), seen


async def test_statuses_that_say_retry_are_retried(aiohttp_server: ServerFactory, ask: Ask) -> None:
    server, seen = await _serve(aiohttp_server, [(503, {}), (429, {"Retry-After": "0"}), (502, {})])
    t = Transport(str(server.make_url("")), None, retry=FAST)
    try:
        assert await ask(t, "/v1/x") == {"ok": True}
        assert len(seen) == 4
        assert t.transfer.retries == 3
    finally:
        await t.close()


async def test_a_429_without_retry_after_and_a_404_are_not(
    aiohttp_server: ServerFactory, ask: Ask
) -> None:
    server, seen = await _serve(aiohttp_server, [(429, {}), (404, {})])
    t = Transport(str(server.make_url("")), None, retry=FAST)
    try:
        with pytest.raises(ServerError):
            await ask(t, "/v1/x")
        with pytest.raises(NotFound):
            await ask(t, "/v1/x")
        assert len(seen) == 2
    finally:
        await t.close()


async def test_attempts_run_out_with_the_last_answer(
    aiohttp_server: ServerFactory, ask: Ask
) -> None:
    server, seen = await _serve(aiohttp_server, [(503, {"Retry-After": "0"})] * 10)
    t = Transport(str(server.make_url("")), None, retry=FAST)
    try:
        with pytest.raises(Unavailable) as failed:
            await ask(t, "/v1/x")
        assert failed.value.retry_after == 0
        assert len(seen) == FAST.attempts
    finally:
        await t.close()


async def test_an_unreachable_server_is_a_transport_error(ask: Ask) -> None:
    t = Transport("http://127.0.0.1:9", None, retry=FAST)
    try:
        with pytest.raises(TransportError, match="after 4 attempts"):
            await ask(t, "/v1/x")
        assert t.transfer.retries == FAST.attempts - 1
    finally:
        await t.close()


async def test_a_server_that_stops_answering_times_out_and_is_retried(
    aiohttp_server: ServerFactory,
) -> None:
    release = asyncio.Event()
    seen: list[int] = []

    async def stall(request: web.Request) -> web.Response:
        seen.append(1)
        await release.wait()
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/v1/x", stall)
    server = await aiohttp_server(app)
    t = Transport(str(server.make_url("")), None, retry=FAST, timeout=0.2)
    try:
        with pytest.raises(TransportError, match="timed out"):
            await t.json("GET", "/v1/x")
        assert len(seen) == FAST.attempts
    finally:
        release.set()
        await t.close()


async def test_paths_are_escaped_once_and_queries_encoded(aiohttp_server: ServerFactory) -> None:
    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"raw": request.raw_path})

    app = web.Application()
    app.router.add_get("/{tail:.*}", echo)
    server = await aiohttp_server(app)
    t = Transport(str(server.make_url("")) + "/base/", None, retry=FAST)
    try:
        answer = await t.json("GET", "/v1/a b/é/%2F", params={"q": "x y&z"})
        assert answer == {"raw": "/base/v1/a%20b/%C3%A9/%2F?q=x+y%26z"}
    finally:
        await t.close()


async def test_a_closed_transport_refuses_at_once(aiohttp_server: ServerFactory, ask: Ask) -> None:
    server, seen = await _serve(aiohttp_server, [])
    t = Transport(str(server.make_url("")), None)  # the default policy would wait seconds
    assert await ask(t, "/v1/x") == {"ok": True}
    await t.close()
    with pytest.raises(TransportError, match="closed"):
        await ask(t, "/v1/x")
    assert len(seen) == 1
    assert t.transfer.retries == 0


async def test_a_prepared_request_sends_each_body_with_its_own_length(
    aiohttp_server: ServerFactory,
) -> None:
    """One head made for many bodies: the token, the type and each body's length."""

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response(
            {
                "body": body.decode(),
                "length": request.headers["Content-Length"],
                "auth": request.headers["Authorization"],
                "type": request.headers["Content-Type"],
                "path": request.raw_path,
            }
        )

    app = web.Application()
    app.router.add_post("/{tail:.*}", echo)
    server = await aiohttp_server(app)
    t = Transport(str(server.make_url("")), "tok", retry=FAST)
    try:
        request = t.prepare("POST", "/v1/a b/x", {"Content-Type": "application/x-test"})
        for parts in ([b"12", b"345"], [b""], [b"6" * 70_000]):
            answer = await asyncio.to_thread(t.send_here, request, parts)
            body = b"".join(parts).decode()
            assert answer == {
                "body": body,
                "length": str(len(body)),
                "auth": "Bearer tok",
                "type": "application/x-test",
                "path": "/v1/a%20b/x",
            }
        assert await asyncio.to_thread(t.send_here, request, [b"{}"], parse=False) is None
        assert t.transfer.requests == 4
    finally:
        await t.close()
