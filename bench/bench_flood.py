"""How responsive the service stays while one tenant floods it (issue 16): `/v1/health`
latency percentiles, measured from outside, during a flood of big JSON bodies, JSON
container bombs, 100k-id `missing` queries and a burst of small requests.

    python bench/bench_flood.py [--seconds 10] [--json]

Run it with this tree and with an older one on PYTHONPATH to compare; the server is
started with the same interpreter and environment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from bench_ingest import Server

BOMB = b'{"metadata": {"x": [' + b"[]," * 2_000_000 + b"[]]}}"  # 6 MB, 2M containers


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _flood(session: aiohttp.ClientSession, url: str, token: str, until: float) -> int:
    """One flooding task: alternates bombs, big valid bodies and 100k-id queries."""
    auth = {"Authorization": f"Bearer {token}"}
    async with session.post(f"{url}/v1/namespaces/f/x/uploads", headers=auth, json={}) as r:
        upload = (await r.json())["upload_id"]
    ids = [os.urandom(32).hex() for _ in range(100_000)]
    big = json.dumps({"chunks": ids}).encode()  # 6.7 MB, all of it real work
    sent = 0
    while time.monotonic() < until:
        for path, body in (
            ("/v1/namespaces/f/x/uploads", BOMB),
            (f"/v1/uploads/{upload}/missing", big),
        ):
            async with session.post(url + path, headers=auth, data=body) as r:
                await r.read()
                sent += 1
    return sent


async def _probe(session: aiohttp.ClientSession, url: str, until: float) -> list[float]:
    latencies = []
    while time.monotonic() < until:
        start = time.perf_counter()
        async with session.get(f"{url}/v1/health") as r:
            await r.read()
        latencies.append(time.perf_counter() - start)
        await asyncio.sleep(0.02)  # pacing the probe, not synchronising anything
    return latencies


async def measure(url: str, admin: str, seconds: float) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        auth = {"Authorization": f"Bearer {admin}"}
        body = {"name": "flood", "scopes": ["read:f/*", "write:f/*"]}
        async with session.post(f"{url}/v1/admin/tokens", headers=auth, json=body) as r:
            token = (await r.json())["token"]
        quiet = await _probe(session, url, time.monotonic() + 2)
        until = time.monotonic() + seconds
        *sent, loud = await asyncio.gather(
            *(_flood(session, url, token, until) for _ in range(4)), _probe(session, url, until)
        )
    return {
        "health_quiet_ms": {q: round(_percentile(quiet, q) * 1000, 2) for q in (0.5, 0.99)},
        "health_flood_ms": {
            **{q: round(_percentile(loud, q) * 1000, 2) for q in (0.5, 0.99)},
            "max": round(max(loud) * 1000, 2),
        },
        "probes": len(loud),
        "flood_requests": sum(sent),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-flood-") as tmp:
        server = Server(Path(tmp) / "data", Path(tmp) / "server.log")
        server.start()
        try:
            deadline = time.monotonic() + 60
            while not (Path(tmp) / "data" / "admin.token").exists():
                server.check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError("server did not start")
                time.sleep(0.05)  # waiting for a starting process to write its token
            time.sleep(0.5)
            out = asyncio.run(measure(server.url, server.token(), args.seconds))
        finally:
            server.stop()
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
