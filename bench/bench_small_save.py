"""One agent saving after every step: a save's latency beside PostgreSQL's and beside the
floors under it, and where the server's CPU goes.

Run by hand, never by the test suite:

    python bench/bench_small_save.py                      # 1000 saves of ~40 kB
    python bench/bench_small_save.py --saves 300 --kb 100 --json

Why: a lone small save (an agent's step, a LangGraph put) is the one place a user sees the
vault slower than the database they would use instead, and its cost is spread over four
threads in three processes. This bench says, in one run, how far a save is from what it
cannot go under: the round trip of an HTTP request to a bare aiohttp app, our own request
stack without a save, and the sync of the same bytes.

What it does: starts `ckpt serve` (bench_langgraph's `start_server`), a bare aiohttp app
(this file with `--bare`: a POST answered with a small JSON, no middleware) and a
PostgreSQL (bench/pgserver.py, stock durability), then a separate client process (this file
with `--client`) that builds a JSON message history of ~`--kb` kB (one ~130-byte message
more per step, the oldest but the first dropped past `--kb` + 5%) and:

1. saves it `--saves` times, one after another (`VaultClient.save`, `chunking="small"`,
   parent the previous checkpoint: the one-request save, acknowledged once synced), while
   the parent reads every server thread's CPU from /proc (all of the server's processes);
2. then times, in rounds of 50 calls of each so the machine's swings fall on all alike:
   the same save; an INSERT of the same bytes into PostgreSQL (psycopg, autocommit: one
   committed transaction, as PostgresSaver's put); a POST of the same bytes to the bare
   aiohttp app (raw socket); `GET /v1/health` and an authenticated `GET /v1/namespaces`
   on the vault (raw socket: our request stack with no save, the second with a token and
   one read transaction); a pwrite + fdatasync of the same bytes over an allocated file
   (what the save journal's acknowledgement waits for).

Prints each call's p50 / p99 and its p50 against the INSERT's, the server's CPU per save by
thread (summed over the processes that have one of that name, busiest first) and the
client's (VaultClient alone: the states are built before the clock starts). Latencies in
ms; Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench_ingest import free_port, log, table
from bench_langgraph import pct, start_server
from pgserver import HOST, PgServer

ROUNDS, ROUND_CALLS = 10, 50  # phase 2: rounds of this many calls of each kind
WARM_SAVES = 50
SYNC_FILE_BYTES = 4 << 20  # the allocated file the sync floor writes over, as the journal


def history(kb: int, rng: random.Random) -> list[dict[str, str]]:
    msgs: list[dict[str, str]] = []
    while len(json.dumps(msgs)) < kb * 1000:
        words = " ".join(rng.choice(("plan", "tool", "result", "call", "ok")) for _ in range(150))
        msgs.append({"role": rng.choice(("user", "assistant", "tool")), "content": words})
    return msgs


def states(kb: int, n: int, seed: int) -> list[bytes]:
    msgs = history(kb, random.Random(seed))
    out = []
    for step in range(n):
        msgs.append({"role": "assistant", "content": f"step {step}: done " * 8})
        if len(json.dumps(msgs)) > kb * 1050:
            del msgs[1]  # a window: the agent keeps ~kb of history after msgs[0]
        out.append(json.dumps(msgs).encode())
    return out


def threads_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far per thread name, over process `pid` and its descendants (a
    worker's threads have names of their own; two workers' add up)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                name = (task / "comm").read_text().strip()
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue  # gone meanwhile: its CPU is lost to the figure
    return out


# -- the client process ---------------------------------------------------------------------


class Raw:
    """One keep-alive HTTP/1.1 connection spoken by hand: the client's own cost kept out of
    the floors (each answer must carry Content-Length, as ours and aiohttp's do)."""

    def __init__(self, port: int) -> None:
        self._sock = socket.create_connection((HOST, port))
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def call(self, request: bytes) -> None:
        self._sock.sendall(request)
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += self._recv()
        head, rest = buf.split(b"\r\n\r\n", 1)
        status = head.split(b"\r\n", 1)[0]
        if not status.startswith(b"HTTP/1.1 2"):
            raise RuntimeError(f"answered {status!r}")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(rest) < length:
            rest += self._recv()

    def _recv(self) -> bytes:
        data = self._sock.recv(1 << 16)
        if not data:
            raise RuntimeError("the server closed the connection")
        return data


def client(config: dict[str, Any]) -> None:
    """Phase 1 when told (a line on stdin), then phase 2; figures as JSON on stdout."""
    import psycopg

    from checkpoint_vault.client import VaultClient

    kb, saves, token = config["kb"], config["saves"], config["token"]
    data = states(kb, WARM_SAVES + saves + ROUNDS * ROUND_CALLS, config["seed"])
    vault = VaultClient(config["url"], token, progress=False)
    parent: list[str | None] = [None]
    step = iter(data)

    def save() -> None:
        rec = vault.save(
            "agents/one", {"state.json": next(step)}, chunking="small", parent=parent[0]
        )
        parent[0] = rec.id

    for _ in range(WARM_SAVES):
        save()
    print("READY", flush=True)
    sys.stdin.readline()
    lat, cpu = [], time.process_time()
    for _ in range(saves):
        start = time.perf_counter()
        save()
        lat.append(time.perf_counter() - start)
    client_cpu = (time.process_time() - cpu) / saves
    print("SAVED", flush=True)
    sys.stdin.readline()

    state = data[-1]
    pg = psycopg.connect(config["pg"], autocommit=True)
    pg.execute("CREATE TABLE agent_state (thread text, step int, state bytea)")
    ours, bare = Raw(config["port"]), Raw(config["bare_port"])
    bearer = f"Authorization: Bearer {token}\r\n".encode()
    post = b"POST /save HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(state) + state
    fd = os.open(config["sync_file"], os.O_RDWR | os.O_CREAT, 0o600)
    os.pwrite(fd, bytes(SYNC_FILE_BYTES), 0)
    os.fsync(fd)
    at = [0]

    def synced() -> None:
        os.pwrite(fd, state, at[0])
        os.fdatasync(fd)
        at[0] = (at[0] + len(state)) % (SYNC_FILE_BYTES - len(state))

    calls: dict[str, Callable[[], None]] = {
        "save": save,
        "insert": lambda: pg.execute(
            "INSERT INTO agent_state VALUES (%s, %s, %s)", ("one", len(timed["insert"]), state)
        ),
        "bare": lambda: bare.call(post),
        "health": lambda: ours.call(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n"),
        "authed": lambda: ours.call(
            b"GET /v1/namespaces HTTP/1.1\r\nHost: x\r\n" + bearer + b"\r\n"
        ),
        "sync": synced,
    }
    timed: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(ROUNDS):
        for name, call in calls.items():
            for _ in range(ROUND_CALLS):
                start = time.perf_counter()
                call()
                timed[name].append(time.perf_counter() - start)
    os.close(fd)
    pg.close()
    vault.close()
    timed["save alone"] = lat
    print(json.dumps({"client_cpu": client_cpu, "sizes": [len(data[0]), len(state)], "ms": timed}))


def bare(port: int) -> None:
    """A POST answered with a small JSON, nothing else: aiohttp's own round trip."""
    from aiohttp import web

    async def post(request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response({"id": "0" * 26, "bytes": len(body)})

    app = web.Application()
    app.router.add_post("/save", post)
    web.run_app(app, host=HOST, port=port, access_log=None, print=None)


# -- the bench -------------------------------------------------------------------------------


def run(saves: int, kb: int, seed: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-small-") as tmpdir, PgServer() as pg:
        tmp = Path(tmpdir)
        server, token = start_server(tmp)
        bare_port = free_port()
        bare_proc = subprocess.Popen([sys.executable, __file__, "--bare", str(bare_port)])
        try:
            wait_listening(bare_port)
            config = {
                "url": server.url,
                "port": server.port,
                "token": token,
                "bare_port": bare_port,
                "pg": pg.conninfo,
                "sync_file": str(tmp / "sync-floor"),
                "kb": kb,
                "saves": saves,
                "seed": seed,
            }
            proc = subprocess.Popen(
                [sys.executable, __file__, "--client", json.dumps(config)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert proc.stdin is not None
            assert proc.stdout is not None
            expect(proc.stdout.readline(), "READY")
            before = threads_cpu(server.pid)
            log(f"{saves} saves, one after another")
            proc.stdin.write("\n")
            proc.stdin.flush()
            expect(proc.stdout.readline(), "SAVED")
            after = threads_cpu(server.pid)
            log(f"{ROUNDS} rounds of {ROUND_CALLS} calls of each kind")
            proc.stdin.write("\n")
            proc.stdin.flush()
            out = json.loads(proc.stdout.readline())
            if proc.wait(60) != 0:
                raise RuntimeError("the client process failed")
        finally:
            bare_proc.terminate()
            bare_proc.wait(30)
            server.stop()
    by_thread = {n: (after[n] - before.get(n, 0.0)) * 1000 / saves for n in after}
    return {
        "saves": saves,
        "state_bytes": out["sizes"],
        "ms": {k: {"p50": pct(v, 0.5), "p99": pct(v, 0.99)} for k, v in out["ms"].items()},
        "server_cpu_ms_per_save": sum(by_thread.values()),
        "server_threads_ms_per_save": {
            n: round(ms, 3)
            for n, ms in sorted(by_thread.items(), key=lambda kv: -kv[1])
            if ms > 0.005
        },
        "client_cpu_ms_per_save": out["client_cpu"] * 1000,
    }


def wait_listening(port: int) -> None:
    for _ in range(300):
        try:
            socket.create_connection((HOST, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def expect(line: str, word: str) -> None:
    if not line.startswith(word):
        raise RuntimeError(f"the client process said {line!r}, not {word}")


ROWS = (
    ("insert", "PostgreSQL: INSERT of the state (autocommit)"),
    ("save", "VaultClient.save (one-request save, synced)"),
    ("save alone", "  the same, phase 1 (CPU measured)"),
    ("sync", "floor: pwrite + fdatasync of the state"),
    ("bare", "floor: POST of the state to bare aiohttp"),
    ("health", "floor: GET /v1/health (our stack)"),
    ("authed", "floor: GET /v1/namespaces (token, one read)"),
)


def report(f: dict[str, Any]) -> str:
    ms, peer = f["ms"], f["ms"]["insert"]["p50"]
    rows = [
        (what, f"{ms[k]['p50']:.3f}", f"{ms[k]['p99']:.3f}", f"{ms[k]['p50'] / peer:.2f}x")
        for k, what in ROWS
    ]
    lo, hi = (n // 1000 for n in f["state_bytes"])
    out = table(
        f"One agent, states of {lo}-{hi} kB, latency in ms from a separate client process",
        ("call", "p50", "p99", "p50 / INSERT's"),
        rows,
    )
    threads = [(name, f"{v:.3f}") for name, v in f["server_threads_ms_per_save"].items()]
    threads.append(("server, all threads", f"{f['server_cpu_ms_per_save']:.3f}"))
    threads.append(("client (VaultClient.save)", f"{f['client_cpu_ms_per_save']:.3f}"))
    return out + "\n" + table(f"CPU per save, {f['saves']} saves, ms", ("thread", "ms"), threads)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--saves", type=int, default=1000)
    p.add_argument("--kb", type=int, default=40, help="size of the first state")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print every figure as JSON last")
    p.add_argument("--client", help=argparse.SUPPRESS)
    p.add_argument("--bare", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.client:
        client(json.loads(args.client))
        return 0
    if args.bare:
        bare(args.bare)
        return 0
    figures = run(args.saves, args.kb, args.seed)
    print(report(figures))
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
