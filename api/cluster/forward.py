"""A request for a shard another process owns, passed on to that owner.

The proxy sends most requests straight to the owner; this is for the rest (a proxy whose
checks have not seen a takeover yet, a client that talks to one node): the body streams
through as it arrives and the answer streams back, so a stale route costs one hop and
never a wrong answer. A forwarded request carries `X-Ckpt-Forwarded`; a process that
receives one for a shard it does not own either answers 503 rather than forwarding it
again (two views that disagree would otherwise bounce it around).

The S3 endpoint forwards with the same code (api/s3/cluster.py), keeping the caller's
`Host`: SigV4 signs it, with every header the caller listed, so the owner checks the
signature as if the request had come straight to it.
"""

from __future__ import annotations

import aiohttp
from aiohttp import web

from checkpoint_vault.cluster import NotOwner

FORWARDED = "X-Ckpt-Forwarded"
SESSION = web.AppKey("cluster_session", aiohttp.ClientSession)  # new_session(), one per app
# Headers of one connection, not of the request (RFC 9110 7.6.1), and the ones aiohttp
# sets itself for the next hop.
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)
CHUNK = 1 << 16


def new_session() -> aiohttp.ClientSession:
    """One per process: bodies are passed through as they are (no decompression), and
    only connecting is bounded (a download may take long)."""
    return aiohttp.ClientSession(
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=2.0),
        connector=aiohttp.TCPConnector(limit=256),
    )


def passed_headers(
    request: web.Request, node: str, *, keep_host: bool = False
) -> list[tuple[str, str]]:
    """The request's headers for the next hop, marked forwarded by `node`. A header sent
    twice is passed on twice (SigV4 joins them in its canonical form)."""
    hop = _HOP - {"host"} if keep_host else _HOP
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in hop]
    headers.append((FORWARDED, node))
    return headers


async def forward(
    request: web.Request,
    session: aiohttp.ClientSession,
    base_url: str,
    node: str,
    *,
    keep_host: bool = False,
) -> web.StreamResponse:
    """`keep_host`: send the caller's `Host` on (a signed S3 request), not the owner's."""
    headers = passed_headers(request, node, keep_host=keep_host)
    body = request.content if request.body_exists else None
    try:
        async with session.request(
            request.method,
            base_url.rstrip("/") + request.raw_path,
            headers=headers,
            data=body,
            allow_redirects=False,
        ) as upstream:
            answer = web.StreamResponse(
                status=upstream.status,
                reason=upstream.reason,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in _HOP},
            )
            await answer.prepare(request)
            async for chunk in upstream.content.iter_chunked(CHUNK):
                await answer.write(chunk)
            await answer.write_eof()
            return answer
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
        raise NotOwner(
            f"the shard's owner at {base_url} did not answer ({type(e).__name__})"
        ) from None
