"""Several server processes on one data dir (`ckpt serve --workers 2`), as a real server.

One process writes; a worker reads the data dir itself and forwards changes (node/supervisor.py,
node/forward.py, node/calls.py). Each test reaches both processes by opening fresh
connections (the kernel spreads them over the two listening sockets) and checks what a
user would: every process answers, a save made through either is read back through
either, a revocation holds on both at once, a killed worker is replaced while the other
keeps serving, and SIGKILL or SIGTERM of the writing process takes its workers along.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.errors import Unauthorized

from ..serverproc import ServerProcess, free_port

RESPAWN_WAIT = 30.0  # seconds: a worker killed young is started again after a pause


def _get(server: ServerProcess, path: str, token: str | None = None) -> tuple[int, Any]:
    """One request on a fresh connection (so the kernel picks the process anew)."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


def _on_each_process(server: ServerProcess, path: str, token: str | None = None) -> dict[int, Any]:
    """`GET path` answered by each of the two processes: {worker index: (status, body)}.
    Bounded by time, not tries: a worker just started again may take seconds to be ready
    on a loaded machine (meanwhile the writing process answers every connection)."""
    seen: dict[int, Any] = {}
    deadline = time.monotonic() + RESPAWN_WAIT
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
        try:
            conn.request("GET", "/v1/health")
            worker = json.loads(conn.getresponse().read())["worker"]
            if worker not in seen:
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                conn.request("GET", path, headers=headers)  # same connection, same process
                resp = conn.getresponse()
                seen[worker] = (resp.status, json.loads(resp.read() or b"null"))
        finally:
            conn.close()
        if len(seen) == 2:
            return seen
    pytest.fail(f"only processes {sorted(seen)} answered in {RESPAWN_WAIT:.0f} s")


def _gone(pid: int, wait: float = 0.0) -> bool:
    """Whether process `pid` has exited, waiting up to `wait` seconds for it (pidfd)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], wait)[0])
    finally:
        os.close(fd)


@pytest.fixture
def two(two_processes: ServerProcess) -> ServerProcess:
    return two_processes


def _listening(port: int) -> int:
    """How many sockets listen on loopback `port` (a socket bound but not yet listening is
    not in /proc/net/tcp)."""
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return sum(r[1] == f"0100007F:{port:04X}" and r[3] == "0A" for r in rows)


@pytest.mark.slow
def test_both_workers_answer_health_with_one_instance(two: ServerProcess) -> None:
    """`--workers 2`: two workers answer on the port, both from the first answer on (the
    first one ready would otherwise take every connection made until the other is); the
    process that writes (0) answers none of its connections (its interpreter lock is the
    writer's)."""
    assert _listening(two.port) == 2
    answers = _on_each_process(two, "/v1/health")
    assert sorted(answers) == [1, 2]
    assert {a[1]["instance"] for a in answers.values()} == {_get(two, "/v1/health")[1]["instance"]}
    assert {a[1]["role"] for a in answers.values()} == {"primary"}


@pytest.mark.slow
def test_saves_through_either_process_read_back_through_either(two: ServerProcess) -> None:
    saved: dict[str, bytes] = {}
    for i in range(12):  # a new client each: its connections land on either process
        with VaultClient(two.url, two.token, local_files=False) as c:
            data = os.urandom(2000) + b"state" * (i + 1)
            ckpt = c.save(f"agents/a{i % 3}", {"state.json": data}, chunking="small")
            saved[ckpt.id] = data
    big = os.urandom(3 << 20)  # an upload session: forwarded requests, chunk batches
    path = two.data_dir.parent / "big.bin"
    path.write_bytes(big)
    with VaultClient(two.url, two.token, local_files=False) as c:
        big_id = c.save("models/m", {"w.bin": str(path)}).id
    for worker, (status, body) in _on_each_process(
        two, "/v1/namespaces/agents/a0/checkpoints", two.token
    ).items():
        assert status == 200, (worker, body)
        assert len(body["checkpoints"]) == 4, worker
    log = [json.loads(line) for line in two.log_path.read_text().splitlines() if '"POST' in line]
    savers = {e["pid"] for e in log if e.get("path", "").endswith("/checkpoints")}
    assert len(savers) == 2, f"one-request saves all went through one process: {savers}"
    for _ in range(3):
        with VaultClient(two.url, two.token, local_files=False) as c:
            for ckpt_id, data in saved.items():
                ns = c.get(f"agents/a{list(saved).index(ckpt_id) % 3}", ckpt_id)
                assert c.read_range(ns.namespace, ckpt_id, "state.json", 0, 1 << 20) == data
            out = two.data_dir.parent / f"restore-{os.urandom(4).hex()}"
            c.load("models/m", big_id, out)
            assert (out / "w.bin").read_bytes() == big


@pytest.mark.slow
def test_revoked_token_is_refused_by_every_process(two: ServerProcess) -> None:
    with VaultClient(two.url, two.token) as admin:
        secret = admin.create_token("reader", ["read:*"]).token
    before = _on_each_process(two, "/v1/namespaces", secret)
    assert {s for s, _ in before.values()} == {200}
    with VaultClient(two.url, two.token) as admin:
        admin.revoke_token("reader")
    after = _on_each_process(two, "/v1/namespaces", secret)
    assert {s for s, _ in after.values()} == {401}
    with pytest.raises(Unauthorized), VaultClient(two.url, secret) as c:
        c.namespaces()


@pytest.mark.slow
def test_a_killed_worker_is_replaced_and_the_other_keeps_serving(two: ServerProcess) -> None:
    worker, _ = two.worker_pids()
    os.kill(worker, signal.SIGKILL)
    with VaultClient(two.url, two.token, local_files=False) as c:
        c.save("agents/k", {"s.json": b"after the kill"}, chunking="small")
    deadline = time.monotonic() + RESPAWN_WAIT
    while not [k for k in two.worker_pids() if k != worker and not _gone(k)]:
        assert time.monotonic() < deadline, "no new worker was started"
        _get(two, "/v1/health")  # paced by real requests, each answered meanwhile
    answers = _on_each_process(two, "/v1/namespaces/agents/k/checkpoints", two.token)
    assert {len(b["checkpoints"]) for _, b in answers.values()} == {1}


@pytest.mark.slow
def test_sigkill_of_the_writer_takes_its_workers_and_a_restart_recovers(
    two: ServerProcess,
) -> None:
    with VaultClient(two.url, two.token, local_files=False) as c:
        ids = [
            c.save("agents/r", {"s.json": os.urandom(500)}, chunking="small").id for _ in range(5)
        ]
    workers = two.worker_pids()
    assert len(workers) == 2
    two.kill()
    assert all(_gone(w, wait=10) for w in workers), "a worker outlived the writing process"
    two.start()
    answers = _on_each_process(two, "/v1/namespaces/agents/r/checkpoints", two.token)
    for _, body in answers.values():
        assert sorted(x["id"] for x in body["checkpoints"]) == sorted(ids)


@pytest.mark.slow
def test_sigterm_stops_every_process(two: ServerProcess) -> None:
    workers = two.worker_pids()
    assert two.terminate() == 0
    assert all(_gone(w) for w in workers), "the writing process exited before its workers"


@pytest.mark.slow
def test_a_port_in_use_is_still_refused(two: ServerProcess, tmp_path: Path) -> None:
    """SO_REUSEPORT would let a second server share the port unnoticed; it must fail."""
    other = subprocess.run(
        [sys.executable, "-m", "checkpoint_vault.cli", "serve", "--data", str(tmp_path / "other")]
        + ["--port", str(two.port), "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("CKPT_")},
    )
    assert other.returncode != 0
    assert "address already in use" in other.stderr.lower(), other.stderr[-2000:]


def _on_worker(server: ServerProcess, path: str, token: str) -> int:
    """`GET path` on a connection worker 1 answers."""
    deadline = time.monotonic() + RESPAWN_WAIT
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
        try:
            conn.request("GET", "/v1/health")
            if json.loads(conn.getresponse().read())["worker"] == 1:
                conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
                resp = conn.getresponse()
                resp.read()
                return resp.status
        finally:
            conn.close()
    pytest.fail(f"the worker answered no connection in {RESPAWN_WAIT:.0f} s")


@pytest.mark.slow
def test_a_token_seen_only_by_the_worker_has_its_last_use_stored(two: ServerProcess) -> None:
    with VaultClient(two.url, two.token) as admin:
        secret = admin.create_token("seen", ["read:*"]).token
    assert _on_worker(two, "/v1/namespaces", secret) == 200
    assert two.terminate() == 0  # the worker hands its uses over as it stops
    two.start()
    with VaultClient(two.url, two.token) as admin:
        (seen,) = [t for t in admin.tokens() if t.name == "seen"]
    assert seen.last_used is not None


@pytest.mark.slow
def test_metrics_count_the_requests_of_every_process(two: ServerProcess) -> None:
    answered = sum(_on_worker(two, "/v1/namespaces", two.token) == 200 for _ in range(7))
    assert answered == 7
    conn = http.client.HTTPConnection(two.host, two.port, timeout=10)
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {two.token}"})
    text = conn.getresponse().read().decode()
    conn.close()
    counted = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("ckpt_http_requests_total{") and 'route="/v1/namespaces"' in line
    )
    assert counted >= 7, text[:2000]
    assert text.count("# TYPE ckpt_http_requests_total counter") == 1
    assert "ckpt_disk_bytes" in text or "ckpt_chunks" in text  # the engine's own gauges too


@pytest.mark.slow
def test_a_tokens_rate_is_the_services_not_each_processes(tmp_path: Path) -> None:
    """With buckets per process, two processes let a token make twice its burst."""
    config = tmp_path / "limits.toml"
    config.write_text("[limits]\nrequests_per_second = 0.01\nburst = 10\n")
    server = ServerProcess(
        tmp_path / "data", free_port(), tmp_path / "server.log", config, workers=2
    )
    try:
        server.start()
        with VaultClient(server.url, server.token) as admin:
            secret = admin.create_token("flood", ["read:*"]).token
        answered: dict[int, list[int]] = {1: [], 2: []}
        deadline = time.monotonic() + RESPAWN_WAIT
        while min(len(v) for v in answered.values()) < 10:  # 10+ tries through each
            assert time.monotonic() < deadline, answered
            conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
            try:
                conn.request("GET", "/v1/health")
                worker = json.loads(conn.getresponse().read())["worker"]
                conn.request("GET", "/v1/namespaces", headers={"Authorization": f"Bearer {secret}"})
                resp = conn.getresponse()
                resp.read()
                answered[worker].append(resp.status)
            finally:
                conn.close()
        statuses = answered[1] + answered[2]
        assert statuses.count(200) == 10, answered  # the burst, once for the service
        assert set(statuses) == {200, 429}
    finally:
        server.stop()


@pytest.mark.slow
def test_a_large_body_hands_the_connection_to_the_writing_process(two: ServerProcess) -> None:
    """A 3 MiB file PUT on a connection the worker holds is not forwarded byte by byte:
    the connection itself moves to the writing process, which answers it and every later
    request on it (node/handoff.py)."""
    data = os.urandom(3 << 20)
    deadline = time.monotonic() + RESPAWN_WAIT
    while True:  # a connection the worker answers
        assert time.monotonic() < deadline, "the worker answered no connection"
        conn = http.client.HTTPConnection(two.host, two.port, timeout=30)
        conn.request("GET", "/v1/health")
        if json.loads(conn.getresponse().read())["worker"] == 1:
            break
        conn.close()
    auth = {"Authorization": f"Bearer {two.token}"}
    conn.request("POST", "/v1/namespaces/big/one/uploads", body=b"{}", headers=auth)
    resp = conn.getresponse()
    assert resp.status == 201
    upload = json.loads(resp.read())["upload_id"]
    conn.request("PUT", f"/v1/uploads/{upload}/files/w.bin", body=data, headers=auth)
    resp = conn.getresponse()
    assert resp.status == 201, resp.read()
    assert json.loads(resp.read())["size"] == len(data)
    conn.request("GET", "/v1/health")  # the same connection, now the writing process's
    assert json.loads(conn.getresponse().read())["worker"] == 0
    conn.request("POST", f"/v1/uploads/{upload}/commit", body=b"{}", headers=auth)
    resp = conn.getresponse()
    assert resp.status == 201, resp.read()
    ckpt_id = json.loads(resp.read())["id"]
    conn.close()
    lines = [json.loads(x) for x in two.log_path.read_text().splitlines() if '"PUT' in x]
    assert [(e["pid"], e["status"]) for e in lines] == [(two.pid, 201)]  # one line, its
    with VaultClient(two.url, two.token, local_files=False) as c:
        assert c.read_range("big/one", ckpt_id, "w.bin", 0, len(data)) == data


def test_sigterm_while_workers_start_stops_them(tmp_path: Path) -> None:
    """A SIGTERM before the workers are ready (the writing process waits for them) still
    stops each before the writing process exits, and the exit is clean."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "checkpoint_vault.cli", "serve", "--data", str(tmp_path / "d")]
        + ["--port", str(free_port()), "--workers", "2"],
        stderr=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if not k.startswith("CKPT_")},
    )
    try:
        kids: list[int] = []
        deadline = time.monotonic() + RESPAWN_WAIT
        while not kids:  # the first worker started: none is ready this soon
            assert time.monotonic() < deadline, "no worker was started"
            assert proc.poll() is None, "the server exited during start-up"
            for task in os.listdir(f"/proc/{proc.pid}/task"):
                with open(f"/proc/{proc.pid}/task/{task}/children") as f:
                    kids += [int(k) for k in f.read().split()]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert all(_gone(k) for k in kids), "the writing process exited before its workers"
    finally:
        proc.kill()
        proc.wait()
