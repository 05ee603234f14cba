"""Every thread the service starts belongs to its runtime, is in docs/DESIGN.md's table,
and is gone once the app has shut down.

The app runs in this process, so the test can compare `threading.enumerate()` against the
runtime; the test client's own threads (asyncio's default executor, for name lookups) are
told apart by a source scan: the service never uses that executor.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from checkpoint_vault.api import Settings, create_app
from checkpoint_vault.api.keys import RUNTIME
from checkpoint_vault.protocol import CHUNK_BATCH_TYPE, encode_chunk_batch
from checkpoint_vault.tiering.backends.local import LocalTier
from checkpoint_vault.vault import FakeClock, Vault, VaultConfig
from checkpoint_vault.vault.frame import chunk_id
from checkpoint_vault.vault.replication import FollowConfig, ReplicationConfig
from checkpoint_vault.vault.runtime import THREADS, Runtime

from ..conftest import Api
from ..unit.vault.helpers import client_save

ROOT = Path(__file__).resolve().parents[2]


def _pool_of(thread: threading.Thread) -> str:
    """The runtime table's row a thread's name belongs to (pool threads are `prefix_N`)."""
    return re.sub(r"_\d+$", "", thread.name)


async def _traffic(api: Api) -> None:
    """Work that reaches every request pool a TCP client can: engine calls (io), a large
    chunk batch (receive), downloads (send, decode), maintenance (io)."""
    await api.save("rt/a", {"w.bin": os.urandom(3 << 20), "meta.json": b"{}"})
    up = await api.open("rt/a")
    chunks = [os.urandom(512 << 10) for _ in range(4)]
    body = b"".join(bytes(p) for p in encode_chunk_batch([(chunk_id(c), c) for c in chunks]))
    resp = await api.call(
        "POST",
        f"/v1/uploads/{up['upload_id']}/chunks",
        data=body,
        headers={"Content-Type": CHUNK_BATCH_TYPE},
    )
    assert resp.status == 200, await resp.text()
    data = await api.read("rt/a", "latest", "w.bin")
    assert len(data) == 3 << 20
    await api.json("POST", "/v1/admin/gc")
    await api.json("POST", "/v1/admin/compact")


async def test_every_thread_the_service_starts_is_the_runtimes_and_ends_with_it(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    settings = dataclasses.replace(
        Settings(
            data_dir=tmp_path / "data",
            vault=VaultConfig(map_size=64 << 20, gc_grace=0.0, max_chunk_size=1 << 20),
        ),
        tiers={"warm": {"url": f"file://{tmp_path / 'warm'}"}},
        replication=ReplicationConfig(tier="warm"),
    )
    before = set(threading.enumerate())
    client = await aiohttp_client(create_app(settings, FakeClock()))
    app = client.server.app
    runtime = app[RUNTIME]
    token = (settings.data_dir / "admin.token").read_text().strip()
    api = Api(client, token, settings.data_dir)
    await _traffic(api)

    started = [t for t in threading.enumerate() if t not in before]
    service = [t for t in started if not t.name.startswith("asyncio_")]
    assert service, "the traffic started no thread"
    strangers = [t.name for t in service if not runtime.owns(t)]
    assert strangers == []
    kinds = {_pool_of(t) for t in service}
    assert {"vault-io", "vault-receive", "vault-send", "vault-writer", "vault-syncer"} <= kinds
    assert {"vault-replica-log", "vault-replica-base"} <= kinds
    assert kinds <= {k.name for k in THREADS}

    await client.close()  # the app's cleanup: the runtime's shutdown order
    left = [t.name for t in service if t.is_alive()]
    assert left == []


def test_the_service_never_uses_asyncios_default_executor() -> None:
    """A thread from `run_in_executor(None, ...)` or `asyncio.to_thread` would belong to no
    runtime: nothing bounds it and shutdown does not wait for it."""
    bad = []
    for package in ("vault", "tiering", "api"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                    continue
                name = node.func.attr
                first = node.args[0] if node.args else None
                if name == "to_thread" or (
                    name == "run_in_executor"
                    and isinstance(first, ast.Constant)
                    and first.value is None
                ):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert bad == []


def test_designs_runtime_table_lists_every_row() -> None:
    """docs/DESIGN.md's runtime table (its Threads part) has one row per thread kind."""
    text = (ROOT / "docs" / "DESIGN.md").read_text()
    section = text[text.index("## Runtime") :]
    section = section[: section.index("\n## ", 1)]
    section = section[section.index("### Threads") :]  # not the channel's table above it
    rows = re.findall(r"^\| `([\w-]+)` \|", section, re.MULTILINE)
    assert sorted(rows) == sorted(k.name for k in THREADS)


def test_close_leaves_a_blocked_hand_over_behind() -> None:
    """A hand-over whose file never answers (a hung FUSE read) holds its thread in the
    kernel: close waits `handover_grace` for it, closes the engine anyway and names the
    thread, which `exit_if_stuck` then exits without (Python's own exit would join it)."""
    runtime = Runtime()
    runtime.handover_grace = 0.2
    blocked = threading.Event()
    started = threading.Event()

    def hung_read() -> None:
        started.set()
        blocked.wait()

    runtime.handover.submit(hung_read)
    assert started.wait(10)
    closed: list[bool] = []
    try:
        runtime.close(lambda: closed.append(True))
        assert closed == [True]
        assert len(runtime.stuck) == 1
        assert runtime.stuck[0].startswith("vault-handover")
    finally:
        blocked.set()


def test_a_process_with_a_blocked_hand_over_still_exits() -> None:
    """Without `exit_if_stuck` this process never ends: Python joins pool threads at exit."""
    script = (
        "import threading\n"
        "from vault.runtime import Runtime, exit_if_stuck\n"
        "r = Runtime()\n"
        "r.handover_grace = 0.1\n"
        "started = threading.Event()\n"
        "r.handover.submit(lambda: (started.set(), threading.Event().wait()))\n"
        "assert started.wait(30)\n"  # else close may cancel it before a thread took it
        "r.close()\n"
        "exit_if_stuck(r)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], timeout=30, capture_output=True)
    assert done.returncode == 0, done.stderr
    assert b"left behind: vault-handover" in done.stderr


def test_a_standbys_threads_are_its_runtimes(tmp_path: Path) -> None:
    """A standby fetches the replica's segments on its runtime's `vault-fetch` pool (it
    used to make a pool of its own on every poll, which no table listed and no shutdown
    waited for); every thread it starts is its runtime's and ends with it."""
    tier = LocalTier(str(tmp_path / "tier"), "cold")
    primary = Vault(
        tmp_path / "primary", tiers={"cold": tier}, replication=ReplicationConfig("cold")
    )
    try:
        client_save(primary, "ns", {"a": b"first"})
        assert primary.roles.replication is not None
        assert primary.roles.replication.wait_restorable(30)
        before = set(threading.enumerate())
        runtime = Runtime()
        standby = Vault(
            tmp_path / "standby",
            tiers={"cold": tier},
            replication=ReplicationConfig("cold"),
            follow=FollowConfig("cold", 0.02),
            runtime=runtime,
        )
        try:
            for i in range(3):
                rec = client_save(primary, "ns", {"a": os.urandom(20_000 + i)})
                deadline = time.monotonic() + 30
                while standby.checkpoints("ns", limit=10)[0][0].id != rec.id:
                    assert time.monotonic() < deadline, "the standby did not follow"
                    time.sleep(0.01)
            started = [t for t in threading.enumerate() if t not in before]
            assert [t.name for t in started if not runtime.owns(t)] == []
            assert {"vault-fetch", "vault-standby"} <= {_pool_of(t) for t in started}
        finally:
            standby.close()
            runtime.close()
        assert [t.name for t in started if t.is_alive()] == []
    finally:
        primary.close()
