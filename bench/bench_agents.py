"""Many agents saving at once: `AsyncVaultClient.save` against INSERTs into PostgreSQL.

Run by hand, never by the test suite:

    python bench/bench_agents.py                          # 16 producers x 20 s per side
    python bench/bench_agents.py --producers 4 --seconds 5 --json

Why: an agent platform checkpoints many conversations at once, each save a whole JSON
state that grows a little per step. The question is how many such saves per second the
vault acknowledges, and how fast, next to the obvious alternative: a row per step in
PostgreSQL.

What it does:

1. `--producers` coroutines (default 16) each play agents: a JSON state (system prompt,
   messages with role/content/tool calls) that starts at ~20 kB and grows by 1-2 messages
   (~0.4-1.6 kB) per step; past 60 kB the agent's thread ends and a new one starts. The
   states come from a per-producer seed, so both sides below get the same bytes.
2. Vault: a fresh `ckpt serve` on loopback, one shared `AsyncVaultClient`; each step is one
   `save("agents/<thread>", {"state.json": bytes}, chunking="small", parent=previous)`,
   i.e. one request. For `--seconds` (default 20).
3. PostgreSQL (bench/pgserver.py: its own instance on loopback, default fsync and
   synchronous_commit): the same producers, one psycopg 3 async connection each, autocommit,
   so each `INSERT INTO agent_state (thread, step, state)` is its own committed transaction.
   `state` is bytea, so the bytes read back can be compared exactly. Same duration.
4. After each side's run, every acknowledged save is read back (vault: `read_range` of the
   checkpoint id; PostgreSQL: a SELECT of the row) and its BLAKE3 compared with what was
   sent. Not timed.

Reported per side: saves/s (acknowledged saves over the run's wall time), state MB/s, p50 /
p99 latency of one save in ms, errors, the read-back check, and bytes on disk (the vault's
data dir; `pg_total_relation_size` of the table, TOAST included, pglz-compressed by default;
PostgreSQL's WAL is not counted), also per acknowledged save since the counts differ; CPU
per acknowledged save of this process (producers making states, hashing them, and the
client or psycopg) and, vault side, of the server (/proc/PID/stat utime + stime). The
two sides run one after the other, vault first, so neither competes with the other for this
shared machine's 2 cores; the server processes and the bench share them. MB = 10^6 bytes.

Needs the `bench` extra (psycopg 3) and PostgreSQL's initdb and pg_ctl
(`apt-get install postgresql`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3
from bench_ingest import log, table
from bench_langgraph import allocated, pct, start_server
from pgserver import PgServer, PgUnavailable
from proc_cpu import tree_cpu
from psycopg import AsyncConnection

from checkpoint_vault.client import AsyncVaultClient

START_BYTES = 20_000  # a new thread's state is padded with history to this size
END_BYTES = 60_000  # past this, the thread ends and the producer starts a new one
MAX_ERRORS = 200  # per side: stop early rather than spin against a broken server
WORDS = (
    "the",
    "file",
    "tool",
    "returned",
    "a",
    "diff",
    "of",
    "lines",
    "in",
    "module",
    "function",
    "test",
    "failed",
    "passed",
    "error",
    "trace",
    "call",
    "result",
    "step",
    "plan",
    "check",
    "read",
    "write",
    "fix",
    "patch",
    "review",
    "agent",
    "user",
    "query",
    "search",
    "open",
    "close",
    "commit",
    "branch",
    "merge",
    "build",
    "run",
    "output",
    "log",
    "value",
)

TABLE_SQL = """CREATE TABLE agent_state (
    thread text NOT NULL,
    step int NOT NULL,
    state bytea NOT NULL,
    PRIMARY KEY (thread, step)
)"""


class Agent:
    """One producer's sequence of agent states: deterministic from its seed."""

    def __init__(self, producer: int, seed: int) -> None:
        self.producer = producer
        self.rng = random.Random(seed * 1000 + producer)
        self.thread_no = -1
        self.thread = ""
        self.step = 0
        self.messages: list[dict[str, Any]] = []
        self._new_thread()

    def _message(self) -> dict[str, Any]:
        role = self.rng.choice(("user", "assistant", "tool"))
        words = self.rng.randint(60, 240)
        msg: dict[str, Any] = {
            "role": role,
            "content": " ".join(self.rng.choice(WORDS) for _ in range(words)),
        }
        if role == "assistant" and self.rng.random() < 0.5:
            msg["tool_calls"] = [
                {"id": f"call_{self.rng.getrandbits(48):012x}", "name": "read_file", "args": {}}
            ]
        return msg

    def _new_thread(self) -> None:
        self.thread_no += 1
        self.thread = f"p{self.producer:02d}-t{self.thread_no:04d}"
        self.step = 0
        self.messages = [{"role": "system", "content": "You are a coding agent."}]
        while len(self.state()) < START_BYTES:
            self.messages.append(self._message())

    def state(self) -> bytes:
        return json.dumps(
            {"thread": self.thread, "step": self.step, "messages": self.messages}
        ).encode()

    def next(self) -> tuple[str, int, bytes]:
        """(thread, step, state bytes) of the next save."""
        if len(self.state()) > END_BYTES:
            self._new_thread()
        else:
            self.step += 1
            for _ in range(self.rng.randint(1, 2)):
                self.messages.append(self._message())
        return self.thread, self.step, self.state()


@dataclass
class Side:
    """What one side's run measured."""

    name: str
    latencies: list[float] = field(default_factory=list)
    acked: list[tuple[str, int, str, bytes]] = field(
        default_factory=list
    )  # thread, step, key, hash
    state_bytes: int = 0
    errors: int = 0
    first_error: str = ""
    wall_s: float = 0.0
    checked: int = 0
    mismatched: int = 0
    disk_bytes: int = 0
    cpu_s: float = 0.0  # this process (producers, client) during the run
    server_cpu_s: float = 0.0  # the vault server's during the run (vault side only)


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


Save = Callable[[str, int, bytes], Awaitable[str]]  # returns the key to read it back by


async def produce(side: Side, save: Save, producers: int, seconds: float, seed: int) -> None:
    """`producers` loops, each saving its agent's next state until the deadline."""
    deadline = time.monotonic() + seconds

    async def one(p: int) -> None:
        agent = Agent(p, seed)
        while time.monotonic() < deadline and side.errors < MAX_ERRORS:
            thread, step, state = agent.next()
            start = time.perf_counter()
            try:
                key = await save(thread, step, state)
            except Exception as e:  # noqa: BLE001 - counted and reported, the run goes on
                side.errors += 1
                side.first_error = side.first_error or f"{type(e).__name__}: {e}"
                continue
            side.latencies.append(time.perf_counter() - start)
            side.acked.append((thread, step, key, blake3.blake3(state).digest()))
            side.state_bytes += len(state)

    t0, cpu0 = time.perf_counter(), own_cpu()
    await asyncio.gather(*(one(p) for p in range(producers)))
    side.wall_s = time.perf_counter() - t0
    side.cpu_s = own_cpu() - cpu0


async def check(side: Side, read: Callable[[str, int, str], Awaitable[bytes]], n: int) -> None:
    """Read back every acknowledged save, `n` at a time, and compare hashes."""
    sem = asyncio.Semaphore(n)

    async def one(thread: str, step: int, key: str, digest: bytes) -> None:
        async with sem:
            try:
                data = await read(thread, step, key)
            except Exception:  # noqa: BLE001 - a save acknowledged but unreadable is a mismatch
                data = b""
        side.checked += 1
        side.mismatched += blake3.blake3(data).digest() != digest

    await asyncio.gather(*(one(*a) for a in side.acked))


async def run_vault(
    tmp: Path, producers: int, seconds: float, seed: int, in_flight: int | None = None
) -> Side:
    """`in_flight`: the client's `small_saves_in_flight` (None: its default)."""
    side = Side("vault" if in_flight is None else f"vault, {in_flight} in flight")
    server, token = start_server(tmp)
    try:
        client = (
            AsyncVaultClient(server.url, token, connections=producers)
            if in_flight is None
            else AsyncVaultClient(
                server.url, token, connections=producers, small_saves_in_flight=in_flight
            )
        )
        async with client as vault:
            parents: dict[str, str] = {}

            async def save(thread: str, step: int, state: bytes) -> str:
                ckpt = await vault.save(
                    f"agents/{thread}",
                    {"state.json": state},
                    chunking="small",
                    parent=parents.get(thread),
                )
                parents[thread] = ckpt.id
                return ckpt.id

            async def read(thread: str, step: int, key: str) -> bytes:
                return await vault.read_range(f"agents/{thread}", key, "state.json", 0, 1 << 20)

            log(f"vault: {producers} producers for {seconds:g} s")
            before = tree_cpu(server.pid)
            await produce(side, save, producers, seconds, seed)
            side.server_cpu_s = tree_cpu(server.pid) - before
            log(f"vault: reading back {len(side.acked)} saves")
            await check(side, read, producers)
        side.disk_bytes = allocated(tmp / "data")
    finally:
        server.stop()
    return side


async def run_postgres(pg: PgServer, producers: int, seconds: float, seed: int) -> Side:
    side = Side("postgres")
    conns = [await AsyncConnection.connect(pg.conninfo, autocommit=True) for _ in range(producers)]
    try:
        await conns[0].execute(TABLE_SQL)
        free: asyncio.Queue[AsyncConnection[Any]] = asyncio.Queue()
        for c in conns:
            free.put_nowait(c)

        async def save(thread: str, step: int, state: bytes) -> str:
            conn = await free.get()
            try:
                await conn.execute(
                    "INSERT INTO agent_state (thread, step, state) VALUES (%s, %s, %s)",
                    (thread, step, state),
                )
            finally:
                free.put_nowait(conn)
            return ""

        async def read(thread: str, step: int, key: str) -> bytes:
            conn = await free.get()
            try:
                cur = await conn.execute(
                    "SELECT state FROM agent_state WHERE thread = %s AND step = %s", (thread, step)
                )
                row = await cur.fetchone()
            finally:
                free.put_nowait(conn)
            return bytes(row[0]) if row else b""

        log(f"postgres: {producers} connections for {seconds:g} s")
        await produce(side, save, producers, seconds, seed)
        log(f"postgres: reading back {len(side.acked)} rows")
        await check(side, read, producers)
        cur = await conns[0].execute("SELECT pg_total_relation_size('agent_state')")
        row = await cur.fetchone()
        side.disk_bytes = int(row[0]) if row else 0
    finally:
        for c in conns:
            await c.close()
    return side


async def run(
    producers: int, seconds: float, seed: int, in_flight: Sequence[int] = ()
) -> list[Side]:
    sides = []
    with PgServer() as pg:
        runs: Sequence[int | None] = in_flight or [None]
        for n in runs:
            with tempfile.TemporaryDirectory(prefix="bench-agents-") as tmpdir:
                sides.append(await run_vault(Path(tmpdir), producers, seconds, seed, n))
        sides.append(await run_postgres(pg, producers, seconds, seed))
    return sides


def figures(side: Side) -> dict[str, Any]:
    n = len(side.latencies)
    return {
        "side": side.name,
        "saves": n,
        "saves_per_s": n / side.wall_s if side.wall_s else 0.0,
        "mb_per_s": side.state_bytes / 1e6 / side.wall_s if side.wall_s else 0.0,
        "mean_state_bytes": side.state_bytes / n if n else 0.0,
        "p50_ms": pct(side.latencies, 0.5) if n else 0.0,
        "p99_ms": pct(side.latencies, 0.99) if n else 0.0,
        "errors": side.errors,
        "first_error": side.first_error,
        "checked": side.checked,
        "mismatched": side.mismatched,
        "disk_bytes": side.disk_bytes,
        "cpu_ms_per_save": side.cpu_s * 1000 / n if n else 0.0,
        "server_cpu_ms_per_save": side.server_cpu_s * 1000 / n if n else 0.0,
    }


def report(figs: list[dict[str, Any]], producers: int, seconds: float) -> str:
    rows: list[tuple[str, ...]] = [
        (
            f"{f['side']} (AsyncVaultClient.save)"
            if f["side"].startswith("vault")
            else "PostgreSQL (INSERT bytea)",
            f"{f['saves']:,}",
            f"{f['saves_per_s']:.1f}",
            f"{f['mb_per_s']:.2f}",
            f"{f['p50_ms']:.1f} / {f['p99_ms']:.1f}",
            str(f["errors"]),
            f"{f['checked'] - f['mismatched']:,}/{f['checked']:,}",
            f"{f['disk_bytes']:,}",
            f"{f['disk_bytes'] / max(1, f['saves']) / 1000:.1f}",
            f"{f['cpu_ms_per_save']:.2f}",
            f"{f['server_cpu_ms_per_save']:.2f}" if f["side"].startswith("vault") else "-",
        )
        for f in figs
    ]
    *vaults, g = figs
    ratios = ", ".join(
        f"{v['saves_per_s'] / g['saves_per_s']:.2f}x" if g["saves_per_s"] else "-" for v in vaults
    )
    title = (
        f"{producers} producers x {seconds:g} s, states "
        f"{START_BYTES // 1000}-{END_BYTES // 1000} kB "
        f"(mean {vaults[0]['mean_state_bytes'] / 1000:.1f} kB); vault / PostgreSQL saves/s = "
        f"{ratios}"
    )
    header = (
        "side",
        "saves",
        "saves/s",
        "MB/s",
        "p50 / p99 ms",
        "errors",
        "read back ok",
        "disk bytes",
        "disk kB / save",
        "bench CPU ms / save",
        "server CPU ms / save",
    )
    return table(title, header, rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--producers", type=int, default=16)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--in-flight",
        type=int,
        nargs="*",
        default=[],
        help="the client's small_saves_in_flight, one vault run per value (default: the "
        "client's default; 0: every save its own request, as before POST /v1/saves)",
    )
    p.add_argument("--json", action="store_true", help="print every figure as JSON last")
    args = p.parse_args(argv)
    try:
        sides = asyncio.run(run(args.producers, args.seconds, args.seed, args.in_flight))
    except PgUnavailable as e:
        print(e, file=sys.stderr)
        return 2
    figs = [figures(s) for s in sides]
    print(report(figs, args.producers, args.seconds))
    for f in figs:
        if f["first_error"]:
            print(f"{f['side']}: first error: {f['first_error']}")
    if args.json:
        print(json.dumps(figs))
    ok = all(f["errors"] == 0 and f["mismatched"] == 0 and f["saves"] > 0 for f in figs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
