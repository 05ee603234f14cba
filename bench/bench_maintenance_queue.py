"""Finding 5 of issue 30's security review, measured: with `worker_threads = 4`, a
compaction paced to the slowest rate the server takes plus four `POST /v1/admin/gc` must
leave another tenant's requests fast, and SIGTERM must stop the server within its
shutdown timeout.

    python bench/bench_maintenance_queue.py [--mib 48] [--seconds 8] [--shutdown 10] [--json]

A real `ckpt serve` (worker_threads = 4, shutdown_timeout = --shutdown, no schedule) gets
two similar checkpoints of --mib MiB each (compaction work) and a small one of the
tenant's. A separate process, with a read-only token for the tenant's namespace, lists its
checkpoints every 50 ms (5 s client timeout) for --seconds: first quiet, then after the
admin requests: `compact?rate=1` (the finding; refused with 400 since the fix, when
`compact?rate=1MiB`, the slowest allowed, is sent instead) and four GCs. Then SIGTERM, and
the time until the process exits (SIGKILL past shutdown + 20 s).

Run it with this tree and with an older one on PYTHONPATH to compare: the server is
started with the same interpreter and environment.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
PROBE_EVERY = 0.05  # seconds between listings: pacing the probe, not synchronising
PROBE_TIMEOUT = 5.0  # seconds before a listing counts as timed out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def _request(
    port: int, method: str, path: str, token: str, body: Any = None, timeout: float = 600.0
) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        headers = {"Authorization": f"Bearer {token}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, json.loads(raw) if raw else None
    finally:
        conn.close()


def probe(port: int, token: str, seconds: float) -> dict[str, float]:
    """The tenant's side (run in its own process): list, pause, repeat; latency figures."""
    latencies: list[float] = []
    timeouts = errors = 0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        start = time.perf_counter()
        try:
            status, _ = _request(
                port, "GET", "/v1/namespaces/tenant/checkpoints", token, timeout=PROBE_TIMEOUT
            )
        except TimeoutError:
            timeouts += 1
            continue
        except OSError:
            errors += 1
            time.sleep(PROBE_EVERY)
            continue
        if status != 200:
            errors += 1
        latencies.append(time.perf_counter() - start)
        time.sleep(PROBE_EVERY)
    ordered = sorted(latencies) or [float("nan")]
    return {
        "answered": len(latencies),
        "timeouts": timeouts,
        "errors": errors,
        "p50_ms": 1000 * ordered[len(ordered) // 2],
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "max_ms": 1000 * ordered[-1],
    }


def _probe_process(port: int, token: str, seconds: float) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--probe", str(port), token, str(seconds)],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 60,
    )
    figures: dict[str, float] = json.loads(out.stdout)
    return figures


def _start(root: Path, shutdown: float) -> tuple[subprocess.Popen[bytes], int]:
    config = root / "vault.toml"
    lines = ["[server]", "worker_threads = 4", f"shutdown_timeout = {shutdown}"]
    lines += ["[maintenance]"]
    jobs = ("retention", "gc", "scrub", "tiering", "compact", "backup", "sample")
    lines += [f"{job}_interval = 0" for job in jobs]
    config.write_text("\n".join(lines) + "\n")
    port = _free_port()
    log = (root / "server.log").open("wb")
    cmd = [sys.executable, "-m", "checkpoint_vault.cli", "serve", "--data", str(root / "data")]
    cmd += ["--host", HOST, "--port", str(port), "--config", str(config)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # polling readiness: a bound, not a pace
        try:
            if _request(port, "GET", "/v1/health", "", timeout=1)[0] == 200:
                return proc, port
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"server did not start:\n{(root / 'server.log').read_text()[-2000:]}")


def _fill(port: int, admin: str, mib: int) -> str:
    """Two similar checkpoints of `mib` MiB to compact, one small one of the tenant's; the
    tenant's read-only token."""
    from checkpoint_vault.client import VaultClient

    weights = bytearray(os.urandom(mib << 20))
    with VaultClient(f"http://{HOST}:{port}", admin, local_files=False) as c:
        c.save("big", {"w.bin": bytes(weights)})
        weights[::4096] = os.urandom(len(weights[::4096]))  # every chunk changes a little
        c.save("big", {"w.bin": bytes(weights)})
        c.save("tenant", {"state.json": b'{"step": 1}'})
    status, issued = _request(
        port, "POST", "/v1/admin/tokens", admin, {"name": "tenant", "scopes": ["read:tenant"]}
    )
    assert status == 201, issued
    token: str = issued["token"]
    return token


def run(mib: int, seconds: float, shutdown: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-mq-") as tmp:
        root = Path(tmp)
        proc, port = _start(root, shutdown)
        try:
            admin = (root / "data" / "admin.token").read_text().strip()
            tenant = _fill(port, admin, mib)
            quiet = _probe_process(port, tenant, seconds)
            answers: dict[str, Any] = {}

            def post(name: str, path: str) -> None:
                try:
                    answers[name] = _request(port, "POST", path, admin)[0]
                except OSError as e:
                    answers[name] = type(e).__name__

            first = ("compact?rate=1", "/v1/admin/compact?rate=1")
            threads = [threading.Thread(target=post, args=first)]
            threads[0].start()
            threads[0].join(2)  # a 400 answers at once; the finding's compaction does not
            if answers.get("compact?rate=1") == 400:
                threads.append(
                    threading.Thread(
                        target=post, args=("compact?rate=1MiB", "/v1/admin/compact?rate=1MiB")
                    )
                )
                threads[-1].start()
            for i in range(4):
                threads.append(threading.Thread(target=post, args=(f"gc{i}", "/v1/admin/gc")))
                threads[-1].start()
            time.sleep(1.0)  # let the five reach the server (a bench, not a test)
            loaded = _probe_process(port, tenant, seconds)
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                code: int | str = proc.wait(timeout=shutdown + 20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                code = "killed"
            exit_seconds = time.monotonic() - started
            for t in threads:
                t.join(10)
            return {
                "quiet": quiet,
                "loaded": loaded,
                "admin_answers": answers,
                "sigterm_exit_seconds": exit_seconds,
                "exit_code": code,
                "shutdown_timeout": shutdown,
            }
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--probe":
        print(json.dumps(probe(int(sys.argv[2]), sys.argv[3], float(sys.argv[4]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=48, help="MiB per checkpoint to compact")
    parser.add_argument("--seconds", type=float, default=8.0, help="probe length per phase")
    parser.add_argument("--shutdown", type=float, default=10.0, help="shutdown_timeout, s")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.mib, args.seconds, args.shutdown)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for phase in ("quiet", "loaded"):
        f = result[phase]
        print(
            f"{phase:7} listings answered {f['answered']:4.0f}  timeouts {f['timeouts']:3.0f}  "
            f"errors {f['errors']:3.0f}  p50 {f['p50_ms']:7.1f} ms  p99 {f['p99_ms']:7.1f} ms  "
            f"max {f['max_ms']:7.1f} ms"
        )
    print(f"admin answers: {result['admin_answers']}")
    print(
        f"SIGTERM -> exit {result['exit_code']} after {result['sigterm_exit_seconds']:.1f} s "
        f"(shutdown_timeout {result['shutdown_timeout']:.0f} s)"
    )


if __name__ == "__main__":
    main()
