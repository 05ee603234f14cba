"""The S3 endpoint as an aiohttp app of its own, on its own port, beside the JSON API.

Why its own port: S3 clients put the bucket first in the path and sign that path, and
several (Hadoop's S3A under Spark, the AWS Java SDK under Flink's S3 plugins) drop any
path an endpoint URL carries, so the endpoint must own the whole path space; and its
requests carry SigV4 signatures and want XML errors, not the JSON API's Bearer tokens and
JSON errors, so it has its own middleware. It shares the process's vault, token cache,
worker pool, per-token shares and rate limits. It runs in the process that writes the data
dir (with `--workers`, only there: every S3 change is a write, and the open uploads live in
that process's memory, api/s3/state.py).

Routing is S3's: `/` lists buckets, `/{bucket}` is a bucket operation chosen by method and
query (`?list-type=2`, `?delete`, `?location`), `/{bucket}/{key}` an object operation
(`?uploads`, `?uploadId=`, `?partNumber=`, `x-amz-copy-source`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import unquote

from aiohttp import web

from checkpoint_vault.vault import VaultError

from ..errors import ApiError
from ..keys import CLOCK, LIMITER, RUNTIME, SETTINGS, TOKENS, TURNS, VAULT
from ..tls import server_context
from . import cluster, listing, multipart, objects, xml
from .errors import S3Error, from_vault, not_implemented
from .keys import MAIN, STATE
from .ops import commit_now
from .signing import authenticate
from .state import S3State
from .tree import commit_after, tree

log = logging.getLogger("ckpt.s3")
IDLE_CHECK = 1.0  # seconds between looks for open uploads past their commit_after
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# A GET of a bucket with only these parameters is ListObjectsV2 (keys are answered as they
# are: without `<EncodingType>` in the answer, SDKs that asked for `url` decode nothing).
LIST_PARAMS = frozenset(
    {
        "list-type",
        "prefix",
        "delimiter",
        "max-keys",
        "continuation-token",
        "start-after",
        "encoding-type",
        "fetch-owner",
    }
)


def _split(request: web.Request) -> tuple[str, str]:
    """(bucket, key) from the path as sent (the router's view has resolved dot segments)."""
    path = request.raw_path.split("?", 1)[0].lstrip("/")
    bucket, _, key = path.partition("/")
    return unquote(bucket), unquote(key)


async def dispatch(request: web.Request) -> web.StreamResponse:
    bucket, key = _split(request)
    q, m = request.query, request.method
    if not bucket:
        if m == "GET":
            return await listing.list_buckets(request)
        raise not_implemented(f"{m} /")
    if not key:
        return await _bucket_op(request, bucket, m)
    if m in ("GET", "HEAD"):
        if "uploadId" in q:
            raise not_implemented("ListParts")
        return await objects.get_object(request, bucket, key)
    if m == "PUT":
        if "partNumber" in q or "uploadId" in q:
            return await multipart.upload_part(request, bucket, key)
        return await objects.put_object(request, bucket, key)
    if m == "POST" and "uploads" in q:
        return await multipart.create(request, bucket, key)
    if m == "POST" and "uploadId" in q:
        return await multipart.complete(request, bucket, key)
    if m == "DELETE":
        if "uploadId" in q:
            return await multipart.abort(request, bucket, key)
        return await objects.delete_object(request, bucket, key)
    raise not_implemented(f"{m} on an object")


async def _bucket_op(request: web.Request, bucket: str, m: str) -> web.StreamResponse:
    query = request.query
    if m == "GET" and "location" in query:
        return await listing.location(request, bucket)
    if m == "GET" and not set(query) - LIST_PARAMS:
        return await listing.list_objects(request, bucket)
    if m == "HEAD":
        return await listing.head_bucket(request, bucket)
    if m == "PUT" and not query:
        return await listing.create_bucket(request, bucket)
    if m == "POST" and "delete" in query:
        return await objects.delete_objects(request, bucket)
    if m == "DELETE" and not query:
        return await listing.delete_bucket(request, bucket)
    raise not_implemented(f"{m} /{bucket}?{'&'.join(query)}")


def _error_response(request: web.Request, error: S3Error, rid: str) -> web.Response:
    resource = error.resource or request.path
    body = b"" if request.method == "HEAD" else xml.error(error.code, error.message, resource, rid)
    headers = {"x-amz-request-id": rid}
    if error.retry_after is not None:
        headers["Retry-After"] = str(error.retry_after)
    return web.Response(
        status=error.status, body=body, content_type="application/xml", headers=headers
    )


@web.middleware
async def s3_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Authenticate, run, and answer every failure as an S3 error document."""
    rid = os.urandom(8).hex().upper()
    try:
        forwarded = await cluster.routed(request, _split(request)[0])  # another shard's
        if forwarded is not None:
            return forwarded
        authenticate(request)
        response = await handler(request)
    except S3Error as e:
        response = _error_response(request, e, rid)
    except VaultError as e:
        response = _error_response(request, from_vault(e), rid)
    except ApiError as e:  # rate limit, body timeouts: the JSON API's own errors
        code = "SlowDown" if e.status == 429 else "InvalidRequest"
        status = 503 if e.status == 429 else e.status
        response = _error_response(request, S3Error(code, status, str(e)), rid)
    except (web.HTTPException, asyncio.CancelledError, ConnectionError):
        raise
    except Exception:
        log.exception("S3 request %s %s failed", request.method, request.path)
        response = _error_response(
            request, S3Error("InternalError", 500, "We encountered an internal error."), rid
        )
    if not response.prepared:
        response.headers["x-amz-request-id"] = rid
    return response


def make_app(main: web.Application) -> web.Application:
    """The S3 app, sharing `main`'s vault, tokens, pool and limits."""
    app = web.Application(middlewares=[s3_middleware], client_max_size=xml.MAX_XML_BODY)
    app[SETTINGS], app[VAULT], app[RUNTIME] = main[SETTINGS], main[VAULT], main[RUNTIME]
    app[TOKENS], app[CLOCK], app[LIMITER] = main[TOKENS], main[CLOCK], main[LIMITER]
    app[TURNS] = main[TURNS]
    app[STATE] = S3State()
    app[MAIN] = main  # what is made after this (the cluster's session) is found there
    app.router.add_route("*", "/{path:.*}", dispatch)
    return app


async def _idle(app: web.Application) -> None:
    """Commit open uploads nobody wrote to for their `commit_after` (frameworks without a
    completion marker). An upload holding only deletions waits for a write, up to half the
    upload TTL; an empty one is aborted."""
    vault, clock = app[VAULT], app[CLOCK]
    loop = asyncio.get_running_loop()
    default = app[SETTINGS].s3_commit_after
    while True:
        await asyncio.sleep(IDLE_CHECK)
        if not await cluster.serving(app):  # a standby's copy: its owner commits them
            continue
        for ns, up in list(app[STATE].opened.items()):
            try:
                wait = await loop.run_in_executor(app[RUNTIME].io, commit_after, vault, ns, default)
                now = clock.now()
                if now - up.last_write < wait:
                    continue
                t = await loop.run_in_executor(
                    app[RUNTIME].io, tree, vault, ns, up.upload_id, up.opened_at
                )
                if t.written or (t.deleted and now - up.opened_at > vault.config.upload_ttl / 2):
                    await commit_now(app, ns)
            except VaultError:
                log.exception("could not commit the open S3 upload of %s", ns)
                app[STATE].opened.pop(ns, None)


async def s3_context(main: web.Application) -> AsyncIterator[None]:
    """Serve the endpoint on `[s3] port` while the main app runs (off when unset)."""
    settings = main[SETTINGS]
    if settings.s3_port is None:
        yield
        return
    app = make_app(main)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(main[RUNTIME].io, app[STATE].recover, main[VAULT], main[CLOCK].now())
    ssl = None
    if settings.tls_cert is not None and settings.tls_key is not None:
        ssl = server_context(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.s3_port, ssl_context=ssl)
    await site.start()
    log.info("S3 endpoint on %s:%s", settings.host, settings.s3_port)
    idle = loop.create_task(_idle(app))
    try:
        yield
    finally:
        idle.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await idle
        await runner.cleanup()
