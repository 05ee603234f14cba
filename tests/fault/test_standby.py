"""A standby over a real SeaweedFS: follow, lose the primary, promote, fence the old one.

Two real `ckpt serve` processes share a replica prefix: a primary replicating to it and a
standby (`--follow replica:cold`). In order, with bounded polling of observable state and
no sleeps as synchronisation:

1. each of a few commits on the primary reads back on the standby within the lag budget
   (plus a poll interval and the poll itself), bytes and LangGraph's `get_tuple` included;
2. every write route of the service (taken from the route table) answers 409 `read_only`
   on the standby and changes nothing;
3. producers save to the primary until a seeded random moment, when it is SIGKILLed;
   `ckpt promote` turns the standby into the primary; everything acknowledged (async: what
   the primary reported in the replica before the kill, tests/fault/test_replication.py
   `owed`) reads back bit-identical from it, and saves go on;
4. the old primary, restarted on its intact disk, is fenced: its writes answer 409
   `fenced`, and a restore of the replica holds exactly the new primary's checkpoints,
   none of what the old one holds alone.
Seed: `STANDBY_SEED` (printed on failure).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from checkpoint_vault.api.routes import setup_routes
from checkpoint_vault.protocol import BUNDLE_TYPE, encode_bundle
from checkpoint_vault.tiering import open_tier
from checkpoint_vault.vault import Vault
from checkpoint_vault.vault.replication import restore_replica

from ..seaweed import SeaweedFS
from ..serverproc import ServerProcess, free_port
from .test_replication import Attempt, _round, owed

SEED = int(os.environ.get("STANDBY_SEED", "1615"))
LAG_BUDGET = 1.0  # seconds: [replication] lag_budget
POLL = 0.2  # seconds: the standby's [standby] poll_interval
DEADLINE = 60.0  # seconds any bounded wait below may take before it fails
KILL_AFTER = (1.3, 2.0)  # seconds of load before the SIGKILL (long enough that async owes some)


def _config(path: Path, seaweed: SeaweedFS, prefix: str, mode: str) -> Path:
    lines = ["[tiers.cold]", f'url = "s3://vault/{prefix}"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in seaweed.options().items()]
    lines += ["[replication]", 'tier = "cold"', f'mode = "{mode}"', f"lag_budget = {LAG_BUDGET}"]
    lines += ["[standby]", f"poll_interval = {POLL}", "[maintenance]"]
    jobs = ("retention", "gc", "scrub", "tiering", "compact", "backup")
    lines += [f"{job}_interval = 0" for job in jobs]
    path.write_text("\n".join(lines) + "\n")
    return path


def _call(
    server: ServerProcess, method: str, path: str, body: Any = None, kind: str = "application/json"
) -> tuple[int, Any]:
    """One request with the admin token: (status, JSON body or raw bytes); a dict body is
    sent as JSON, bytes as they are."""
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if isinstance(body, dict) else body
    req = urllib.request.Request(
        server.url + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {server.token}", "Content-Type": kind},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - loopback
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def _wait(ok: Callable[[], bool], what: str, deadline: float = DEADLINE) -> float:
    """Poll until `ok()`, bounded; returns the seconds it took."""
    started = time.monotonic()
    while not ok():
        assert time.monotonic() - started < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
    return time.monotonic() - started


def _caught_up(server: ServerProcess) -> bool:
    r = _call(server, "GET", "/v1/stats")[1]["replication"]
    return bool(r["lag_bytes"] == 0 and r["lag_seconds"] == 0 and not r["base_pending"])


def _save(server: ServerProcess, ns: str, files: dict[str, bytes], key: str) -> tuple[int, Any]:
    """A one-request save with idempotency key `key` (also the metadata's `attempt`)."""
    body = encode_bundle({"metadata": {"attempt": key}, "key": key}, list(files.items()))
    return _call(server, "POST", f"/v1/namespaces/{ns}/checkpoints", body, BUNDLE_TYPE)


def _ids(server: ServerProcess, ns: str) -> set[str]:
    status, body = _call(server, "GET", f"/v1/namespaces/{ns}/checkpoints?limit=1000")
    return {c["id"] for c in body["checkpoints"]} if status == 200 else set()


@dataclass
class Pair:
    primary: ServerProcess
    standby: ServerProcess
    mode: str  # replication mode of both ("async" or "sync")


@pytest.fixture
def pair(tmp_path: Path, seaweed: SeaweedFS, request: pytest.FixtureRequest) -> Iterator[Pair]:
    """A primary and a standby of its replica, in `request.param` replication mode."""
    mode = request.param
    prefix = f"standby-{mode}-{SEED}"
    config = _config(tmp_path / "vault.toml", seaweed, prefix, mode)
    primary = ServerProcess(tmp_path / "primary", free_port(), tmp_path / "primary.log", config)
    standby = ServerProcess(
        tmp_path / "standby",
        free_port(),
        tmp_path / "standby.log",
        config,
        extra_args=("--follow", "replica:cold"),
    )
    try:
        primary.start()
        _wait(lambda: _caught_up(primary), "the primary's first base")
        standby.data_dir.mkdir()
        (standby.data_dir / "admin.token").write_text(primary.token)  # the operator's copy
        standby.start()
        yield Pair(primary, standby, mode)
    except AssertionError:
        print(f"STANDBY_SEED={SEED}\n{primary.log_tail()}\n{standby.log_tail()}")
        raise
    finally:
        standby.stop()
        primary.stop()


@pytest.mark.slow
@pytest.mark.parametrize("pair", ["async", "sync"], indirect=True)
def test_standby_follows_takes_over_and_fences_the_old_primary(
    pair: Pair, seaweed: SeaweedFS, tmp_path: Path
) -> None:
    primary, standby, mode = pair.primary, pair.standby, pair.mode
    rng = random.Random(f"standby-{SEED}-{mode}")
    assert _call(standby, "GET", "/v1/health")[1]["role"] == "standby"
    steady = _reads_follow(primary, standby, rng)
    _langgraph_reads_follow(primary, standby)
    _writes_refused(standby)

    log: list[Attempt] = []
    samples = asyncio.run(_round(primary, rng, log, KILL_AFTER))
    status, out = _ckpt(standby, "status")
    assert (status, out["role"]) == (0, "standby"), out
    status, out = _ckpt(standby, "promote")
    assert status == 0, out
    assert out["epoch"] == 1
    assert out["role"] == "primary"
    print(f"{mode}: {len(log)} attempts, {sum(a.checkpoint is not None for a in log)} acked")
    new_primary = standby
    reported = owed(samples)
    must = [
        a for a in log if a.checkpoint is not None and (mode == "sync" or a.checkpoint in reported)
    ]
    assert must
    assert asyncio.run(_read_back(new_primary, must)) == len(must)
    assert steady <= _ids(new_primary, "steady")
    after = [
        _save(new_primary, "after", {"a": rng.randbytes(3000)}, f"after-key-{SEED}-{i:04d}")
        for i in range(3)
    ]
    assert [s for s, _ in after] == [201] * 3, after
    assert {b["id"] for _, b in after} <= _ids(new_primary, "after")

    primary.start()  # the old primary, back on its intact disk
    assert _call(primary, "GET", "/v1/health")[1]["role"] == "fenced"
    status, body = _save(
        primary, "fault-0", {"a": b"split brain"}, "old-primary-after-the-promotion"
    )
    assert (status, body["error"]["code"]) == (409, "fenced")
    status, body = _call(primary, "PUT", "/v1/policy/default", {"retention": {"keep_last": 1}})
    assert (status, body["error"]["code"]) == (409, "fenced")
    _wait(lambda: _caught_up(new_primary), "the new primary's replica")
    _replica_is_the_new_primary(seaweed, new_primary, primary, mode, tmp_path / "restored")


def _reads_follow(primary: ServerProcess, standby: ServerProcess, rng: random.Random) -> set[str]:
    """Commit on the primary -> listed, shown and read back on the standby. How soon is a
    figure for a benchmark on a quiet machine, not an assert on a shared one: here it only
    has to happen within the bounded wait."""
    for i in range(5):
        files = {"w.bin": rng.randbytes(rng.randrange(1000, 40_000))}
        status, rec = _save(primary, "steady", files, f"steady-key-{SEED}-{i:04d}")
        assert status == 201, rec
        path = f"/v1/namespaces/steady/checkpoints/{rec['id']}"

        def shown(path: str = path) -> bool:
            return _call(standby, "GET", path)[0] == 200

        _wait(shown, "the standby")
        assert _call(standby, "GET", path + "/files/w.bin")[1] == files["w.bin"]
    steady = _ids(primary, "steady")
    assert _ids(standby, "steady") == steady
    health = _call(standby, "GET", "/v1/health")[1]
    assert health["lag_seconds"] is not None
    stats = _call(standby, "GET", "/v1/stats")[1]
    assert stats["role"] == "standby"
    assert stats["standby"]["batches"] > 0
    return steady


def _langgraph_reads_follow(primary: ServerProcess, standby: ServerProcess) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    from checkpoint_vault.client.langgraph import VaultSaver

    cfg: Any = {"configurable": {"thread_id": "standby-thread", "checkpoint_ns": ""}}
    ckpt = empty_checkpoint()
    ckpt["channel_values"] = {"messages": ["hello from the primary"]}
    ckpt["channel_versions"] = {"messages": 1}
    with VaultSaver(primary.url, primary.token) as writer:
        saved = writer.put(cfg, ckpt, {"step": 1}, {"messages": 1})  # type: ignore[typeddict-item]
        want = writer.get_tuple(saved)
    assert want is not None
    with VaultSaver(standby.url, standby.token, cache_bytes=0) as reader:
        _wait(lambda: reader.get_tuple(saved) is not None, "get_tuple on the standby")
        assert reader.get_tuple(saved) == want
        assert reader.get_tuple(cfg) == want  # the thread's latest


def _write_routes() -> list[tuple[str, str]]:
    """(method, path template) of every route that is not a read, from the route table."""
    app = web.Application()
    setup_routes(app)
    out = []
    for route in app.router.routes():
        info = route.resource.canonical if route.resource is not None else ""
        if route.method not in ("GET", "HEAD", "OPTIONS", "*") and info != "/v1/admin/promote":
            out.append((route.method, info))
    return out


def _writes_refused(standby: ServerProcess) -> None:
    before = _call(standby, "GET", "/v1/stats")[1]
    ref = next(iter(_ids(standby, "steady")))
    values = {"ns": "steady", "ref": ref, "upload_id": "u" * 26, "name": "admin"}
    values["chunk_id"] = "0" * 64
    routes = _write_routes()
    assert len(routes) >= 20, routes
    for method, template in routes:
        path = re.sub(r"\{(\w+)(?::[^}]*)?\}", lambda m: values.get(m.group(1), "x"), template)
        status, body = _call(standby, method, path, {"namespace": "other", "all": True})
        assert status == 409, (method, path, status, body)
        assert body["error"]["code"] == "read_only", (method, path, body)
    after = _call(standby, "GET", "/v1/stats")[1]
    for key in ("checkpoints", "chunks", "stored_bytes", "namespaces"):
        assert after[key] == before[key], key


def _ckpt(server: ServerProcess, *args: str) -> tuple[int, Any]:
    """`ckpt ... --json` against `server`, as an operator runs it: (exit code, the JSON
    printed, or stderr)."""
    out = subprocess.run(
        [sys.executable, "-m", "checkpoint_vault.cli", "--url", server.url, "--token", server.token]
        + [*args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("CKPT_")},
    )
    return out.returncode, json.loads(out.stdout) if out.returncode == 0 else out.stderr


async def _read_back(server: ServerProcess, attempts: list[Attempt]) -> int:
    """Read every file of `attempts` from `server`, compared byte for byte; returns how
    many checkpoints matched."""
    headers = {"Authorization": f"Bearer {server.token}"}
    async with aiohttp.ClientSession(headers=headers) as http:

        async def one(a: Attempt) -> int:
            for name, data in a.files.items():
                url = f"{server.url}/v1/namespaces/{a.ns}/checkpoints/{a.checkpoint}/files/{name}"
                async with http.get(url) as r:
                    assert r.status == 200, (a.key, r.status, await r.text())
                    assert await r.read() == data, f"{a.checkpoint}/{name} differs"
            return 1

        return sum(await asyncio.gather(*(one(a) for a in attempts)))


def _replica_is_the_new_primary(
    seaweed: SeaweedFS,
    new_primary: ServerProcess,
    old_primary: ServerProcess,
    mode: str,
    target: Path,
) -> None:
    """A restore of the replica holds the new primary's checkpoints and none the old primary
    holds alone (acknowledged from its disk after the promotion, or never replicated)."""
    tier = open_tier("cold", f"s3://vault/standby-{mode}-{SEED}", seaweed.options())
    out = restore_replica(tier, target / "vault")
    assert out.epoch == 1
    restored = Vault(target / "vault")
    try:
        for ns in ("fault-0", "fault-1", "after", "steady"):
            new, old = _ids(new_primary, ns), _ids(old_primary, ns)
            have = {r.id for r in restored.checkpoints(ns, limit=1000)[0]} if new else set()
            assert have == new, ns
            assert not (old - new) & have, ns
        assert restored.check().ok
    finally:
        restored.close()
