"""The client's side of a LangGraph put: CPU per saver call, VaultSaver against
PostgresSaver, in one run.

Run by hand, never by the test suite:

    python bench/bench_langgraph_cpu.py                 # 60 turns
    python bench/bench_langgraph_cpu.py --turns 100 --profile 25

Latency on this shared machine swings with whatever else runs; the CPU a call costs the
calling process does not (much). So, as bench_langgraph.py does, it records a chat agent's
calls on InMemorySaver, replays each call into both savers in turn (VaultSaver on a fresh
`ckpt serve`, PostgresSaver on a PostgreSQL the bench starts) and reports, per call kind:

- client CPU per call: `time.process_time()` across the call, so every thread of this
  process counts (a hop to a loop or transport thread is not free just because the caller
  sleeps meanwhile), serialization included; and the calling thread's share
  (`time.thread_time()`);
- wall-clock p50 and the vault/pg ratio;
- then `get_tuple` of the latest checkpoint, and whole `graph.invoke` turns.

`--profile N`: cProfile the VaultSaver's replayed calls and print the top N functions by
cumulative time (the figures above then include the profiler's cost; use for where, not
how much).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench_ingest import log, table
from bench_langgraph import ask, build, record, start_server
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres import PostgresSaver
from pgserver import PgServer, PgUnavailable
from psycopg import Connection
from psycopg.rows import dict_row

from checkpoint_vault.client.langgraph import VaultSaver

CALLS = ("put", "put_writes", "get_tuple", "graph.invoke")
GETS = 100


class Meter:
    """Wall, process CPU and thread CPU of each call, by saver and call kind."""

    def __init__(self) -> None:
        self.wall: dict[tuple[str, str], list[float]] = {}
        self.cpu: dict[tuple[str, str], list[float]] = {}
        self.own: dict[tuple[str, str], list[float]] = {}

    def time(self, who: str, what: str, call: Callable[..., Any], *args: Any) -> Any:
        c0, t0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
        out = call(*args)
        w1, t1, c1 = time.perf_counter(), time.thread_time(), time.process_time()
        self.wall.setdefault((who, what), []).append(w1 - w0)
        self.cpu.setdefault((who, what), []).append(c1 - c0)
        self.own.setdefault((who, what), []).append(t1 - t0)
        return out


def p50(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def replay(
    savers: dict[str, BaseCheckpointSaver[Any]],
    calls: Sequence[tuple[str, tuple[Any, ...]]],
    meter: Meter,
    profiler: cProfile.Profile | None,
) -> None:
    for name, args in calls:
        for who, saver in savers.items():
            if profiler is not None and who == "vault":
                profiler.enable()
                meter.time(who, name, getattr(saver, name), *args)
                profiler.disable()
            else:
                meter.time(who, name, getattr(saver, name), *args)
    latest: RunnableConfig = {"configurable": {"thread_id": "bench", "checkpoint_ns": ""}}
    for _ in range(GETS):
        for who, saver in savers.items():
            assert meter.time(who, "get_tuple", saver.get_tuple, latest)


def turns(savers: dict[str, BaseCheckpointSaver[Any]], n: int, meter: Meter) -> None:
    graphs = {who: build(saver) for who, saver in savers.items()}
    cfg: RunnableConfig = {"configurable": {"thread_id": "bench-graph"}}
    for i in range(n):
        for who, graph in graphs.items():
            meter.time(who, "graph.invoke", graph.invoke, ask(i), cfg)


def run(n_turns: int, profile: int) -> str:
    log(f"recording {n_turns} turns on InMemorySaver")
    calls = record(n_turns)
    meter = Meter()
    profiler = cProfile.Profile() if profile else None
    with tempfile.TemporaryDirectory(prefix="bench-lgcpu-") as tmpdir, PgServer() as pg:
        server, token = start_server(Path(tmpdir))
        try:
            with (
                Connection.connect(
                    pg.conninfo, autocommit=True, prepare_threshold=0, row_factory=dict_row
                ) as pg_conn,
                VaultSaver(server.url, token) as saver,
            ):
                postgres = PostgresSaver(pg_conn)
                postgres.setup()
                savers: dict[str, BaseCheckpointSaver[Any]] = {"vault": saver, "pg": postgres}
                log("replaying the calls into both savers")
                replay(savers, calls, meter, profiler)
                log("timing graph runs")
                turns(savers, n_turns, meter)
        finally:
            server.stop()
    rows: list[tuple[str, ...]] = []
    for what in CALLS:
        v, g = ("vault", what), ("pg", what)
        rows.append(
            (
                what,
                str(len(meter.cpu[v])),
                f"{mean(meter.cpu[v]) * 1e3:.3f} / {mean(meter.own[v]) * 1e3:.3f}",
                f"{mean(meter.cpu[g]) * 1e3:.3f} / {mean(meter.own[g]) * 1e3:.3f}",
                f"{mean(meter.cpu[v]) / mean(meter.cpu[g]):.2f}x",
                f"{p50(meter.wall[v]) * 1e3:.2f} / {p50(meter.wall[g]) * 1e3:.2f}",
                f"{p50(meter.wall[v]) / p50(meter.wall[g]):.2f}x",
            )
        )
    out = table(
        f"Client CPU and latency per call ({n_turns} turns replayed; ms)",
        (
            "call",
            "n",
            "VaultSaver CPU process / thread",
            "PostgresSaver CPU process / thread",
            "CPU vault/pg",
            "p50 vault / pg",
            "p50 vault/pg",
        ),
        rows,
    )
    if profiler is not None:
        stats = pstats.Stats(profiler).sort_stats("cumulative")
        stats.print_stats(profile)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--turns", type=int, default=60)
    p.add_argument("--profile", type=int, default=0, metavar="N")
    args = p.parse_args(argv)
    try:
        print(run(args.turns, args.profile))
    except PgUnavailable as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
