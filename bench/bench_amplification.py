"""Commit amplification (issue 30, finding 2): while four commits each list one stored
4 MiB chunk 50,000 times (~195 GiB logical from a 3.4 MB body), how long another
tenant's listing takes and when each of the four commits is answered (accepted or
refused), against a real `ckpt serve` with `worker_threads = 4`.

    python bench/bench_amplification.py [--repeats 50000] [--commit-timeout 120] [--json]

The listing is probed from its own thread, one request after another, until every commit
has answered; a commit or listing not answered within --commit-timeout counts as that
long and "no answer" / "unanswered". Run it with this tree and with an older one on
PYTHONPATH to compare (the server is started with the same interpreter and environment).
Done when: each listing under 1 s and each commit answered within 30 s.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import blake3

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.serverproc import ServerProcess, free_port  # noqa: E402

CHUNK = 4 << 20
COMMITS = 4


class Http:
    """One keep-alive connection to the server with a bearer token (one thread's)."""

    def __init__(self, port: int, token: str, timeout: float) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        self.auth = {"Authorization": f"Bearer {token}"}

    def call(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> Any:
        headers = dict(self.auth)
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        self.conn.request(method, path, body=data, headers=headers)
        resp = self.conn.getresponse()
        text = resp.read()
        return resp.status, (json.loads(text) if text else None)

    def ok(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> Any:
        status, out = self.call(method, path, body, raw)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {out}")
        return out


def _prepare(port: int, admin: str) -> tuple[str, str, list[tuple[str, str]]]:
    """Tokens for the two tenants, the other's one checkpoint, and the attacker's four
    open sessions each holding one sent 4 MiB chunk: (attacker, other, [(upload, id)])."""
    root = Http(port, admin, 60)
    tokens = []
    for name, scopes in (("amp", ["read:amp/*", "write:amp/*"]), ("other", ["read:o/*"])):
        tokens.append(root.ok("POST", "/v1/admin/tokens", {"name": name, "scopes": scopes}))
    up = root.ok("POST", "/v1/namespaces/o/x/uploads", {})["upload_id"]
    root.ok("PUT", f"/v1/uploads/{up}/files/f", raw=os.urandom(1 << 16))
    root.ok("POST", f"/v1/uploads/{up}/commit", {})
    attacker = Http(port, tokens[0]["token"], 60)
    sessions = []
    for i in range(COMMITS):
        up = attacker.ok("POST", f"/v1/namespaces/amp/n{i}/uploads", {})["upload_id"]
        data = os.urandom(CHUNK)
        cid = blake3.blake3(data).hexdigest()
        attacker.ok("PUT", f"/v1/uploads/{up}/chunks/{cid}", raw=data)
        sessions.append((up, cid))
    return tokens[0]["token"], tokens[1]["token"], sessions


def measure(port: int, admin: str, repeats: int, commit_timeout: float) -> dict[str, Any]:
    attacker, other, sessions = _prepare(port, admin)
    answers: list[dict[str, Any]] = [{} for _ in sessions]
    listings: list[float] = []
    done = threading.Event()

    def commit(i: int, upload: str, cid: str, start: float) -> None:
        files = {"f": {"size": repeats * CHUNK, "chunks": [cid] * repeats}}
        try:
            status, out = Http(port, attacker, commit_timeout).call(
                "POST", f"/v1/uploads/{upload}/commit", {"files": files}
            )
            code = out["error"]["code"] if status >= 400 else "created"
        except OSError as e:  # the client's own timeout: not answered in commit_timeout
            status, code = 0, f"no answer ({type(e).__name__})"
        answers[i] = {"status": status, "code": code, "s": round(time.monotonic() - start, 3)}

    unanswered: list[int] = []

    def probe() -> None:
        client = Http(port, other, commit_timeout)
        while not done.is_set():
            t = time.perf_counter()
            try:
                client.ok("GET", "/v1/namespaces/o/x/checkpoints")
            except OSError:  # not answered within commit_timeout: counted at that wait
                unanswered.append(1)
                client = Http(port, other, commit_timeout)
            listings.append(time.perf_counter() - t)

    prober = threading.Thread(target=probe)
    prober.start()
    start = time.monotonic()
    threads = [
        threading.Thread(target=commit, args=(i, up, cid, start))
        for i, (up, cid) in enumerate(sessions)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    prober.join()
    ordered = sorted(listings)
    return {
        "repeats": repeats,
        "body_bytes": len(json.dumps({"files": {"f": {"chunks": ["0" * 64] * repeats}}})),
        "commits": answers,
        "commits_all_answered_s": round(max(a["s"] for a in answers), 3),
        "listing_ms": {
            "count": len(ordered),
            "p50": round(ordered[len(ordered) // 2] * 1000, 2),
            "max": round(ordered[-1] * 1000, 2),
            "unanswered": len(unanswered),
        },
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=50_000)
    p.add_argument("--commit-timeout", type=float, default=120.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-amp-") as tmp:
        config = Path(tmp) / "ckpt.toml"
        config.write_text("[server]\nworker_threads = 4\n")
        server = ServerProcess(Path(tmp) / "data", free_port(), Path(tmp) / "server.log", config)
        server.start()
        try:
            out = measure(server.port, server.token, args.repeats, args.commit_timeout)
        finally:
            server.stop()
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
