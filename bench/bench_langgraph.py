"""LangGraph savers: VaultSaver against SqliteSaver and PostgresSaver, same run.

Run by hand, never by the test suite:

    python bench/bench_langgraph.py               # 100 chat turns
    python bench/bench_langgraph.py --turns 200 --json

What it does, in one temp dir:

1. runs a chat agent for `--turns` turns on LangGraph's InMemorySaver and records every
   `put` and `put_writes` it makes (a 3-node graph: plan -> agent -> tool; each turn adds
   a ~0.9 kB question and a ~0.9 kB answer, and LangGraph re-serializes the whole message
   history at every step);
2. replays exactly those calls, one at a time, into a SqliteSaver on a local file (WAL, as
   the saver sets it up), a PostgresSaver (langgraph-checkpoint-postgres, psycopg 3, one
   autocommit connection) on a PostgreSQL the bench starts itself (bench/pgserver.py:
   loopback, default fsync and synchronous_commit) and a VaultSaver talking to a fresh
   `ckpt serve` on loopback, timing each call; then times `get_tuple` of the latest
   checkpoint and of random past ones on all three. Calls alternate between the savers, so
   load from elsewhere on a shared machine falls on all alike;
3. runs the same turns through `graph.invoke` on each saver and times whole turns (one
   turn: 1 get_tuple, 5 puts, 4 put_writes);
4. reports stored bytes: the server's `stored_bytes` growth (GET /v1/stats: chunk frames
   after dedup and zstd) against the sum of the checkpoint and write blobs SQLite holds for
   the same calls, and what each really takes on disk: the vault's data dir (its catalog,
   with a record and a manifest per checkpoint, is not in `stored_bytes`), the SQLite files
   and `pg_total_relation_size` of PostgresSaver's checkpoints, checkpoint_blobs and
   checkpoint_writes tables (with their indexes and TOAST).

Needs the `bench` extra (`pip install -e '.[test,bench]'`) and PostgreSQL's initdb and
pg_ctl (`apt-get install postgresql`).

Latencies are in milliseconds; sizes in bytes (MB = 10^6).
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import closing
from pathlib import Path
from typing import Annotated, Any, TypedDict

from bench_ingest import Server, log, table
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from pgserver import PgServer, PgUnavailable
from psycopg import Connection
from psycopg.rows import DictRow, dict_row

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.langgraph import VaultSaver

FILLER = "lorem ipsum dolor sit amet, consectetur adipiscing elit " * 16
READY_ATTEMPTS = 600
READY_POLL_S = 0.05
GET_SAMPLES = 200
SAVERS = ("vault", "sqlite", "postgres")
LABELS = {"vault": "VaultSaver", "sqlite": "SqliteSaver", "postgres": "PostgresSaver"}
PG_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")


class Chat(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    turns: int


def build(saver: BaseCheckpointSaver[Any]) -> Any:
    b = StateGraph(Chat)
    b.add_node("plan", lambda s: {"turns": s.get("turns", 0) + 1})
    b.add_node(
        "agent", lambda s: {"messages": [AIMessage(content=f"answer {s['turns']}: {FILLER}")]}
    )
    b.add_node("tool", lambda s: {})
    b.add_edge(START, "plan")
    b.add_edge("plan", "agent")
    b.add_edge("agent", "tool")
    return b.compile(checkpointer=saver)


def ask(i: int) -> dict[str, Any]:
    return {"messages": [HumanMessage(content=f"question {i}: {FILLER}")]}


class Recorder(InMemorySaver):
    """Keeps every call, so the same workload can be replayed into each saver."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        args = (_plain(config), *copy.deepcopy((checkpoint, metadata, new_versions)))
        self.calls.append(("put", args))
        return super().put(config, checkpoint, metadata, new_versions)

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        self.calls.append(
            ("put_writes", (_plain(config), copy.deepcopy(writes), task_id, task_path))
        )
        super().put_writes(config, writes, task_id, task_path)


def _plain(config: RunnableConfig) -> RunnableConfig:
    return {"configurable": {k: v for k, v in config["configurable"].items() if isinstance(v, str)}}


def record(turns: int) -> list[tuple[str, tuple[Any, ...]]]:
    rec = Recorder()
    graph = build(rec)
    cfg: RunnableConfig = {"configurable": {"thread_id": "bench"}}
    for i in range(turns):
        graph.invoke(ask(i), cfg)
    return rec.calls


Savers = dict[str, BaseCheckpointSaver[Any]]
Samples = dict[str, dict[str, list[float]]]  # saver -> call -> seconds


def timed(samples: Samples, who: str, what: str, call: Callable[..., Any], *args: Any) -> Any:
    start = time.perf_counter()
    out = call(*args)
    samples.setdefault(who, {}).setdefault(what, []).append(time.perf_counter() - start)
    return out


def replay(savers: Savers, calls: Sequence[tuple[str, tuple[Any, ...]]], samples: Samples) -> None:
    """Each call into every saver in turn, so a burst of load on this shared machine hits
    all alike instead of whichever happened to run then."""
    for name, args in calls:
        for who, saver in savers.items():
            timed(samples, who, name, getattr(saver, name), *args)


def time_gets(savers: Savers, ids: list[str], seed: int, samples: Samples) -> None:
    latest: RunnableConfig = {"configurable": {"thread_id": "bench", "checkpoint_ns": ""}}
    rng = random.Random(seed)
    for _ in range(GET_SAMPLES):
        past: RunnableConfig = {
            "configurable": {**latest["configurable"], "checkpoint_id": rng.choice(ids)}
        }
        for who, saver in savers.items():
            assert timed(samples, who, "get_tuple latest", saver.get_tuple, latest)
            assert timed(samples, who, "get_tuple by id", saver.get_tuple, past)


def time_turns(savers: Savers, turns: int, samples: Samples) -> None:
    graphs = {who: build(saver) for who, saver in savers.items()}
    cfg: RunnableConfig = {"configurable": {"thread_id": "bench-graph"}}
    for i in range(turns):
        for who, graph in graphs.items():
            timed(samples, who, "graph.invoke", graph.invoke, ask(i), cfg)


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def sqlite_blob_bytes(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        cp = conn.execute(
            "SELECT COALESCE(SUM(LENGTH(checkpoint) + LENGTH(metadata)), 0) FROM checkpoints"
        ).fetchone()[0]
        wr = conn.execute("SELECT COALESCE(SUM(LENGTH(value)), 0) FROM writes").fetchone()[0]
    return int(cp) + int(wr)


def pg_table_bytes(conn: Connection[DictRow]) -> dict[str, int]:
    """pg_total_relation_size (heap + indexes + TOAST) of each PostgresSaver table."""
    out: dict[str, int] = {}
    for name in PG_TABLES:
        row = conn.execute("SELECT pg_total_relation_size(%s::regclass) AS n", (name,)).fetchone()
        out[name] = int(row["n"]) if row else 0
    return out


def allocated(root: Path) -> int:
    """Bytes of disk the files under `root` really take (LMDB maps are sparse)."""
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


def start_server(tmp: Path) -> tuple[Server, str]:
    server = Server(tmp / "data", tmp / "server.log")
    server.start()
    token_file = tmp / "data" / "admin.token"
    for _ in range(READY_ATTEMPTS):
        server.check_alive()
        if token_file.exists():
            try:
                with VaultClient(server.url, token_file.read_text().strip()) as c:
                    c.health()
                return server, token_file.read_text().strip()
            except Exception:  # noqa: BLE001 - not up yet; retried a bounded number of times
                pass
        time.sleep(READY_POLL_S)
    raise RuntimeError("server did not become ready")


def run(turns: int, seed: int) -> dict[str, Any]:
    log(f"recording {turns} turns on InMemorySaver")
    calls = record(turns)
    ids = [args[1]["id"] for name, args in calls if name == "put"]
    figures: dict[str, Any] = {"turns": turns, "puts": len(ids), "calls": len(calls)}
    samples: Samples = {}
    with (
        tempfile.TemporaryDirectory(prefix="bench-langgraph-") as tmpdir,
        PgServer() as pg,
    ):
        tmp = Path(tmpdir)
        db = tmp / "checkpoints.sqlite"
        server, token = start_server(tmp)
        try:
            with (
                closing(sqlite3.connect(db, check_same_thread=False)) as conn,
                Connection.connect(
                    pg.conninfo, autocommit=True, prepare_threshold=0, row_factory=dict_row
                ) as pg_conn,
                VaultClient(server.url, token) as vault,
                VaultSaver(server.url, token) as saver,
            ):
                postgres = PostgresSaver(pg_conn)
                postgres.setup()
                savers: Savers = {"vault": saver, "sqlite": SqliteSaver(conn), "postgres": postgres}
                before = vault.stats()
                log("replaying the calls into the three savers")
                replay(savers, calls, samples)
                after = vault.stats()
                figures["vault_disk_bytes"] = allocated(tmp / "data")
                figures["sqlite_blob_bytes"] = sqlite_blob_bytes(db)
                figures["sqlite_file_bytes"] = sum(
                    p.stat().st_size for p in tmp.glob("checkpoints.sqlite*")
                )
                figures["pg_table_bytes"] = pg_table_bytes(pg_conn)
                log("timing get_tuple")
                time_gets(savers, ids, seed, samples)
                log("timing graph runs")
                time_turns(savers, turns, samples)
        finally:
            server.stop()
    figures["vault_stored_bytes"] = after.stored_bytes - before.stored_bytes
    figures["vault_logical_bytes"] = after.logical_bytes - before.logical_bytes
    figures["latency_ms"] = {
        who: {op: {"p50": pct(s, 0.5), "p99": pct(s, 0.99), "n": len(s)} for op, s in ops.items()}
        for who, ops in samples.items()
    }
    return figures


def report(f: dict[str, Any]) -> str:
    lat = f["latency_ms"]
    rows: list[tuple[str, ...]] = []
    for op in ("put", "put_writes", "get_tuple latest", "get_tuple by id", "graph.invoke"):
        v, s, g = (lat[who][op] for who in SAVERS)
        rows.append(
            (
                op,
                str(v["n"]),
                *(f"{x['p50']:.2f} / {x['p99']:.2f}" for x in (v, s, g)),
                f"{v['p50'] / s['p50']:.2f}x",
                f"{v['p50'] / g['p50']:.2f}x",
            )
        )
    out = table(
        f"Latency, ms ({f['turns']} turns, {f['puts']} puts replayed one at a time)",
        (
            "call",
            "n",
            *(f"{LABELS[who]} p50 / p99" for who in SAVERS),
            "vault/sqlite p50",
            "vault/pg p50",
        ),
        rows,
    )
    pg = f["pg_table_bytes"]
    pg_total = sum(pg.values())
    size_rows: list[tuple[str, ...]] = [
        ("SQLite: checkpoint + metadata + write blobs", f"{f['sqlite_blob_bytes']:,}"),
        ("SQLite: database files on disk", f"{f['sqlite_file_bytes']:,}"),
        *((f"PostgreSQL: {name} (total relation size)", f"{pg[name]:,}") for name in PG_TABLES),
        ("PostgreSQL: the three tables", f"{pg_total:,}"),
        ("vault: logical bytes saved", f"{f['vault_logical_bytes']:,}"),
        ("vault: stored bytes (after dedup + zstd)", f"{f['vault_stored_bytes']:,}"),
        ("vault: data dir on disk (chunks + catalog)", f"{f['vault_disk_bytes']:,}"),
        (
            "vault stored / SQLite blobs",
            f"{f['vault_stored_bytes'] / max(1, f['sqlite_blob_bytes']):.4f}",
        ),
        (
            "vault data dir / SQLite files",
            f"{f['vault_disk_bytes'] / max(1, f['sqlite_file_bytes']):.4f}",
        ),
        ("vault data dir / PostgreSQL tables", f"{f['vault_disk_bytes'] / max(1, pg_total):.4f}"),
    ]
    return out + "\n" + table("Bytes for the same calls", ("what", "bytes"), size_rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--turns", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print every figure as JSON last")
    args = p.parse_args(argv)
    try:
        figures = run(args.turns, args.seed)
    except PgUnavailable as e:
        print(e, file=sys.stderr)
        return 2
    print(report(figures))
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
