"""Finding 5 of issue 30's security review, replayed: maintenance requests waiting for the
maintenance lock used to wait on worker threads, so `compact?rate=1` holding the lock and
four queued GCs filled a 4-thread pool, every tenant timed out, and SIGTERM did not stop
the server. Now they wait in the maintenance queue (api/jobs.py), holding no worker; a
rate below 1 MiB/s is refused; SIGTERM stops a paced compaction at its next step.

The first test runs in-process: it needs the lock's and the queue's own reports of who
waits (`wait_for_waiters`, `wait_for_queued`) to know the five requests are waiting before
it asks for anything else. The others run a real `ckpt serve`, since what they are about
is the process: its signal handling, its shutdown timeout and its exit status.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import threading
from pathlib import Path
from typing import Any

from checkpoint_vault.api import Settings, create_app
from checkpoint_vault.api.keys import QUEUE, VAULT
from checkpoint_vault.api.settings import Maintenance
from checkpoint_vault.client import VaultClient
from checkpoint_vault.vault import FakeClock, VaultConfig

from ..conftest import Api
from ..lockholder import holder_of
from ..serverproc import ServerProcess, free_port

WAIT = 30.0  # seconds: a bound on each wait below, never a pace
QUIET = Maintenance(
    retention_interval=0,
    gc_interval=0,
    scrub_interval=0,
    compact_interval=0,
    tiering_interval=0,
    sample_interval=0,
)


async def test_waiting_maintenance_requests_hold_no_worker(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        vault=VaultConfig(map_size=4 << 20),
        worker_threads=4,
        maintenance=QUIET,
    )
    client = await aiohttp_client(create_app(settings, clock))
    api = Api(client, (settings.data_dir / "admin.token").read_text().strip(), settings.data_dir)
    await api.save("tenant", {"w": b"weights" * 1000})
    app = client.server.app
    vault = app[VAULT]
    held, release = threading.Event(), threading.Event()

    def operator() -> None:  # a long run (the paced compaction of the finding) holds the lock
        with vault.maintenance.hold("compact"):
            held.set()
            release.wait(WAIT)

    t = threading.Thread(target=operator)
    t.start()
    try:
        assert await asyncio.to_thread(held.wait, WAIT)
        admin = [asyncio.ensure_future(api.call("POST", "/v1/admin/compact?rate=1MiB"))]
        admin += [asyncio.ensure_future(api.call("POST", "/v1/admin/gc")) for _ in range(4)]
        assert await asyncio.to_thread(vault.maintenance.wait_for_waiters, 1, WAIT)
        assert await asyncio.to_thread(app[QUEUE].wait_for_queued, 4, WAIT)
        # Twice the pool's threads of tenant requests, all answered while the five wait.
        listings = await asyncio.wait_for(
            asyncio.gather(
                *(api.json("GET", "/v1/namespaces/tenant/checkpoints") for _ in range(8))
            ),
            WAIT,
        )
        assert all(len(page["checkpoints"]) == 1 for page in listings)
        assert not any(a.done() for a in admin), "a maintenance request ran past the lock"
    finally:
        release.set()
        await asyncio.to_thread(t.join, WAIT)
    assert [(await a).status for a in admin] == [200] * 5


def _config(path: Path) -> Path:
    lines = ["[server]", "worker_threads = 4", f"shutdown_timeout = {SHUTDOWN}", "[maintenance]"]
    jobs = ("retention", "gc", "scrub", "tiering", "compact", "backup", "sample")
    lines += [f"{job}_interval = 0" for job in jobs]
    path.write_text("\n".join(lines) + "\n")
    return path


SHUTDOWN = 10  # seconds: the server's shutdown_timeout
WEIGHTS = 24 << 20  # bytes per checkpoint: three 8 MiB compaction batches, 24 s at 1 MiB/s


def _post(server: ServerProcess, path: str) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=WAIT + SHUTDOWN)
    try:
        conn.request("POST", path, headers={"Authorization": f"Bearer {server.token}"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def test_sigterm_stops_a_paced_compaction_and_rates_have_a_floor(tmp_path: Path) -> None:
    server = ServerProcess(
        tmp_path / "data", free_port(), tmp_path / "server.log", _config(tmp_path / "v.toml")
    )
    try:
        server.start()
        for path in ("/v1/admin/compact?rate=1", "/v1/admin/verify?rate=512KiB"):
            status, body = _post(server, path)
            assert (status, body["error"]["code"]) == (400, "invalid_request"), body
            assert "at least 1048576" in body["error"]["message"]
        older = bytearray(os.urandom(WEIGHTS))
        with VaultClient(server.url, server.token, local_files=False) as c:
            c.save("tenant", {"w.bin": bytes(older)})
            older[::4096] = os.urandom(len(older[::4096]))  # every chunk changes a little
            c.save("tenant", {"w.bin": bytes(older)})

        answer: list[tuple[int, dict[str, Any]]] = []
        compact = threading.Thread(
            target=lambda: answer.append(_post(server, "/v1/admin/compact?rate=1MiB"))
        )
        compact.start()
        lock_file = server.data_dir / "vault" / "maintenance.lock"
        for _ in range(int(WAIT / 0.05)):  # bounded: until the server holds the lock
            if (holder_of(lock_file) or "").endswith("compact"):
                break
            compact.join(0.05)
        assert (holder_of(lock_file) or "").endswith("compact"), server.log_tail()
        # Paced to 1 MiB/s, the compaction has ~20 s left: SIGTERM must not wait for it.
        assert server.terminate(timeout=SHUTDOWN) == 0, server.log_tail()
        compact.join(WAIT)
        assert [status for status, _ in answer] == [503], answer
        assert answer[0][1]["error"]["code"] == "unavailable"
        assert "shutting down" in answer[0][1]["error"]["message"]
    finally:
        server.stop()
