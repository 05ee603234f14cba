"""One agent saving its state after every step: `VaultClient.save` latency, and its cost.

Run by hand, never by the test suite:

    python bench/bench_small_save.py                      # 1000 saves of ~100 kB
    python bench/bench_small_save.py --saves 300 --kb 50 --json

What it does: starts `ckpt serve` on loopback; one `VaultClient` saves a JSON message
history of ~`--kb` kB (one ~130-byte message more per step, the oldest after the first
dropped past `--kb` + 5%, so each save shares all but a few chunks with the previous one)
into one namespace, `chunking="small"`, parent the
previous checkpoint: the one-request save, one writer transaction, synced before the
answer. Reports the save's p50 / p99, the floor of one request (`GET /v1/health` p50), and
where the time goes: CPU per save of the server's event loop, writer thread and worker
threads (from /proc, so Linux only) and of the client process (which also builds the
states, so an upper bound). Latencies in ms.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench_ingest import log, table
from bench_langgraph import pct, start_server

from checkpoint_vault.client import VaultClient

HEALTH_SAMPLES = 300


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds per thread id of process `pid`."""
    out: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def history(kb: int, rng: random.Random) -> list[dict[str, str]]:
    msgs: list[dict[str, str]] = []
    while len(json.dumps(msgs)) < kb * 1000:
        words = " ".join(rng.choice(("plan", "tool", "result", "call", "ok")) for _ in range(150))
        msgs.append({"role": rng.choice(("user", "assistant", "tool")), "content": words})
    return msgs


def run(saves: int, kb: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    msgs = history(kb, rng)
    with tempfile.TemporaryDirectory(prefix="bench-small-") as tmpdir:
        server, token = start_server(Path(tmpdir))
        try:
            with VaultClient(server.url, token) as vault:
                health = []
                for _ in range(HEALTH_SAMPLES):
                    start = time.perf_counter()
                    vault.health()
                    health.append(time.perf_counter() - start)
                states = []
                for step in range(saves):
                    msgs.append({"role": "assistant", "content": f"step {step}: done " * 8})
                    if len(json.dumps(msgs)) > kb * 1050:
                        del msgs[1]  # a window: the agent keeps ~kb of history after msgs[0]
                    states.append(json.dumps(msgs).encode())
                log(f"{saves} saves of {len(states[0]) // 1000}-{len(states[-1]) // 1000} kB")
                before, me = thread_cpu(server.pid), resource.getrusage(resource.RUSAGE_SELF)
                lat, parent = [], None
                for state in states:
                    start = time.perf_counter()
                    rec = vault.save(
                        "agents/one", {"state.json": state}, chunking="small", parent=parent
                    )
                    lat.append(time.perf_counter() - start)
                    parent = rec.id
                after, me2 = thread_cpu(server.pid), resource.getrusage(resource.RUSAGE_SELF)
        finally:
            server.stop()
    per_thread = sorted(
        ((after[t] - before.get(t, 0.0)) * 1000 / saves for t in after), reverse=True
    )
    client_cpu = me2.ru_utime + me2.ru_stime - me.ru_utime - me.ru_stime
    return {
        "saves": saves,
        "state_bytes": [len(states[0]), len(states[-1])],
        "save_ms": {"p50": pct(lat, 0.5), "p99": pct(lat, 0.99)},
        "health_ms": {"p50": pct(health, 0.5), "p99": pct(health, 0.99)},
        "server_cpu_ms_per_save": sum(per_thread),
        "server_threads_cpu_ms_per_save": [round(x, 3) for x in per_thread if x > 0.005],
        "client_cpu_ms_per_save": client_cpu * 1000 / saves,
    }


def report(f: dict[str, Any]) -> str:
    rows = [
        ("VaultClient.save p50 / p99", f"{f['save_ms']['p50']:.2f} / {f['save_ms']['p99']:.2f}"),
        ("GET /v1/health p50 / p99", f"{f['health_ms']['p50']:.2f} / {f['health_ms']['p99']:.2f}"),
        ("server CPU per save", f"{f['server_cpu_ms_per_save']:.2f}"),
        (
            "  by thread (loop, writer, workers: busiest first)",
            " ".join(f"{x:.2f}" for x in f["server_threads_cpu_ms_per_save"]),
        ),
        ("client CPU per save (incl. building states)", f"{f['client_cpu_ms_per_save']:.2f}"),
    ]
    lo, hi = (n // 1000 for n in f["state_bytes"])
    return table(f"One agent, {f['saves']} saves of {lo}-{hi} kB, ms", ("what", "ms"), rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--saves", type=int, default=1000)
    p.add_argument("--kb", type=int, default=100, help="size of the first state")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print every figure as JSON last")
    args = p.parse_args(argv)
    figures = run(args.saves, args.kb, args.seed)
    print(report(figures))
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
