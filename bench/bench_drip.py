"""How long another tenant's save takes while one token drips chunk batches (issue 30,
finding 1): 64 `POST /v1/uploads/{id}/chunks` declaring 2 MiB, 100 bytes sent, then a byte
every 2 s, all from one write token in this process; meanwhile a separate process saves
24 MiB with `VaultClient(local_files=False)` under another token (batches of 1 MiB and
more: receiver threads) and the save is timed there.

    python bench/bench_drip.py [--drips 64] [--size-mib 24] [--seconds 12] [--json]

Before the per-token receiver share the save waited as long as the drips lasted; with it
the dripping token holds its share (16 receivers) and its other batches are refused 429.
Run it with an older tree first on PYTHONPATH to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from bench_ingest import HOST, Server

from checkpoint_vault.protocol import CHUNK_BATCH_TYPE

DECLARED = 2 << 20  # each dripped batch's Content-Length
DRIP_EVERY = 2.0  # seconds between dripped bytes: under body_timeout's idle timer

SAVER = """
import os, sys, time
from checkpoint_vault.client import VaultClient
url, token, path = sys.argv[1:4]
with VaultClient(url, token, local_files=False, progress=False) as vault:
    start = time.perf_counter()
    vault.save("t/run", {"weights.bin": path})
    print(time.perf_counter() - start)
"""


async def _token(session: aiohttp.ClientSession, url: str, admin: str, name: str) -> str:
    auth = {"Authorization": f"Bearer {admin}"}
    body = {"name": name, "scopes": [f"read:{name[0]}/*", f"write:{name[0]}/*"]}
    async with session.post(f"{url}/v1/admin/tokens", headers=auth, json=body) as r:
        return str((await r.json())["token"])


async def _drip(port: int, token: str, upload: str, stop: asyncio.Event) -> str:
    """One dripped batch until `stop` or the server answers; what the server said first."""
    reader, writer = await asyncio.open_connection(HOST, port)
    head = (
        f"POST /v1/uploads/{upload}/chunks HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: {CHUNK_BATCH_TYPE}\r\n"
        f"Content-Length: {DECLARED}\r\n\r\n"
    )
    writer.write(head.encode() + b"\0" * 100)
    try:
        await writer.drain()
        while not stop.is_set():
            try:
                answer = await asyncio.wait_for(reader.read(64), DRIP_EVERY)
            except TimeoutError:
                writer.write(b"\0")  # the drip itself
                await writer.drain()
                continue
            return answer.split(b"\r\n", 1)[0].decode() or "closed"
        return "held to the end"
    except OSError:
        return "closed"
    finally:
        writer.close()


async def _stop_after(stop: asyncio.Event, seconds: float) -> None:
    """The drips last `seconds` at most (the review's lasted 12 s): a save stalled behind
    them then shows as a wait of about that long rather than a hang."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        stop.set()


async def measure(
    server: Server, drips: int, size: int, tmp: Path, seconds: float
) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        admin = server.token()
        dripper = await _token(session, server.url, admin, "dripper")
        tenant = await _token(session, server.url, admin, "tenant")
        auth = {"Authorization": f"Bearer {dripper}"}
        async with session.post(f"{server.url}/v1/namespaces/d/x/uploads", headers=auth) as r:
            upload = (await r.json())["upload_id"]
    stop = asyncio.Event()
    dripping = [
        asyncio.ensure_future(_drip(server.port, dripper, upload, stop)) for _ in range(drips)
    ]
    limit = asyncio.ensure_future(_stop_after(stop, seconds))
    await asyncio.sleep(1.0)  # let every drip reach the server (pacing, not synchronising)
    weights = tmp / "weights.bin"
    weights.write_bytes(os.urandom(size))
    started = time.perf_counter()
    saver = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        SAVER,
        server.url,
        tenant,
        str(weights),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await saver.communicate()
    wall = time.perf_counter() - started
    stop.set()
    answers = await asyncio.gather(*dripping)
    await limit
    if saver.returncode != 0:
        raise RuntimeError(f"the save failed: {err.decode()[-2000:]}")
    return {
        "save_seconds": round(float(out.decode().strip().splitlines()[-1]), 2),
        "saver_process_seconds": round(wall, 2),
        "size_mib": size >> 20,
        "drips": {a: answers.count(a) for a in sorted(set(answers))},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drips", type=int, default=64)
    p.add_argument("--size-mib", type=int, default=24)
    p.add_argument("--seconds", type=float, default=12.0, help="how long the drips last at most")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-drip-") as name:
        tmp = Path(name)
        server = Server(tmp / "data", tmp / "server.log")
        server.start()
        try:
            deadline = time.monotonic() + 60
            while not (tmp / "data" / "admin.token").exists():
                server.check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError("server did not start")
                time.sleep(0.05)  # waiting for a starting process to write its token
            time.sleep(0.5)
            out = asyncio.run(measure(server, args.drips, args.size_mib << 20, tmp, args.seconds))
        finally:
            server.stop()
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
