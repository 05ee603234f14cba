"""Losing the primary's disk: replication to a real SeaweedFS, SIGKILL, data dir deleted.

Each round starts `ckpt serve` on a data dir restored from the replica (the first on an
empty one), runs producers that save small checkpoints (one-request saves, no client
retries; every attempt's exact bytes and the client's time of the answer are kept), SIGKILLs
the server at a seeded random moment, deletes its whole data dir, and restores a fresh one
from the replica. The restored vault is then checked offline:

- sync: every acknowledged checkpoint is there (recovery point 0);
- async: every checkpoint the primary reported in the replica before the kill is there. A
  watcher reads `GET /v1/stats` through the round: its `replication.batches` (commit
  batches so far) covers every checkpoint acknowledged before the read (the primary numbers
  a batch before it answers), and once a later read's `restorable_batch` reaches that
  number, the replica holds them. The lag budget is an alerting threshold, not a promise,
  so it decides nothing here; the rounds must owe something, or the rule would be idle;
- everything once restored stays in every later restore;
- nothing partial: each listed checkpoint is one the producers attempted, and every file
  reads back bit-identical; `check` is ok (no drift, nothing missing or damaged);
- tokens come back: the first server's admin token still works after every restore.

A second test kills SeaweedFS under an async primary: saves keep being acknowledged, the
lag grows and `/metrics` reports it, and after the restart the replica catches up with
nothing missing. Seed: `REPLICA_SEED` (printed on failure).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from checkpoint_vault.protocol import BUNDLE_TYPE, encode_bundle
from checkpoint_vault.tiering import open_tier
from checkpoint_vault.vault import StoredCheckpoint, Vault
from checkpoint_vault.vault.errors import ReplicaNotFound
from checkpoint_vault.vault.replication import restore_replica
from checkpoint_vault.vault.tokens import verify

from ..seaweed import SeaweedFS
from ..serverproc import ServerProcess, free_port

pytestmark = pytest.mark.slow  # every test here takes over a second (the quick loop skips them)

SEED = int(os.environ.get("REPLICA_SEED", "1515"))
ROUNDS = 10  # per mode: 20 kill-and-restore rounds in all
PRODUCERS = 2
LAG_BUDGET = 1.0  # seconds, the config's [replication] lag_budget
OUTAGE_LAG_BUDGET = 0.25  # the outage test's: it waits for the lag to pass it
ROUND_SECONDS = (0.2, 1.8)  # the kill lands uniformly in this long after the server is up
CATCH_UP = 30.0  # seconds to wait for the replica after SeaweedFS returns


@dataclass(frozen=True)
class Sample:
    """One read of the primary's replication position during a round."""

    acked: frozenset[str]  # checkpoints acknowledged before the read was sent
    batches: int  # commit batches numbered so far: covers every one of `acked`
    restorable: int  # the replica can restore every batch up to this one


def owed(samples: list[Sample]) -> set[str]:
    """What the replica was reported to hold: every checkpoint acknowledged before a read
    whose batch count a read (that one or a later one) reported restorable."""
    reached = max((s.restorable for s in samples), default=0)
    return set().union(*(s.acked for s in samples if s.batches <= reached))


@dataclass
class Attempt:
    key: str
    ns: str
    files: dict[str, bytes]
    acked_at: float | None = None  # client clock, when the 201 arrived
    checkpoint: str | None = None
    status: int | None = None  # the answer's HTTP status (None: no answer)


def _config(
    path: Path, seaweed: SeaweedFS, prefix: str, mode: str, lag_budget: float = LAG_BUDGET
) -> Path:
    opts = seaweed.options()
    lines = [
        "[tiers.cold]",
        f'url = "s3://vault/{prefix}"',
        *(f"{k} = {json.dumps(v)}" for k, v in opts.items()),
        "[replication]",
        'tier = "cold"',
        f'mode = "{mode}"',
        f"lag_budget = {lag_budget}",
        'base_after = "1MiB"',  # a base every few rounds: restore replays a bounded log
        "[maintenance]",
        *(
            f"{job}_interval = 0"
            for job in ("retention", "gc", "scrub", "tiering", "compact", "backup")
        ),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


async def _produce(
    url: str,
    token: str,
    rng: random.Random,
    who: int,
    log: list[Attempt],
    stop: asyncio.Event,
    limit: int | None = None,
) -> None:
    """Save until `stop` is set, the server is gone, or `limit` saves were acknowledged."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": BUNDLE_TYPE}
    async with aiohttp.ClientSession(headers=headers) as http:
        n = acks = 0
        while not stop.is_set() and (limit is None or acks < limit):
            n += 1
            key = f"p{who}-{len(log):06d}-{n:06d}-{rng.getrandbits(32):08x}"
            files = {"w.bin": rng.randbytes(rng.randrange(1000, 30_000)), "step": key.encode()}
            a = Attempt(key, f"fault-{who % 2}", files)
            log.append(a)
            body = encode_bundle({"metadata": {"attempt": key}, "key": key}, list(files.items()))
            try:
                async with http.post(f"{url}/v1/namespaces/{a.ns}/checkpoints", data=body) as r:
                    a.status = r.status
                    # a kill shows as no answer; an error answer is a fault, never skipped
                    assert r.status in (200, 201), f"{r.status}: {await r.text()}"
                    a.checkpoint = (await r.json())["id"]
                    a.acked_at = time.time()
                    acks += 1
            except (aiohttp.ClientError, OSError):
                return  # the server is gone


async def _watch(
    server: ServerProcess, log: list[Attempt], first: int, samples: list[Sample]
) -> None:
    """Read the primary's replication position until it is gone (see the module doc)."""
    headers = {"Authorization": f"Bearer {server.token}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        while True:
            acked = frozenset(a.checkpoint for a in log[first:] if a.checkpoint is not None)
            try:
                async with http.get(f"{server.url}/v1/stats") as r:
                    assert r.status == 200, await r.text()
                    position = (await r.json())["replication"]
            except (aiohttp.ClientError, OSError):
                return  # the server is gone
            samples.append(Sample(acked, position["batches"], position["restorable_batch"]))
            await asyncio.sleep(0.02)  # pacing the reads, not a sync point


async def _round(
    server: ServerProcess,
    rng: random.Random,
    log: list[Attempt],
    window: tuple[float, float] = ROUND_SECONDS,
) -> list[Sample]:
    """Producers and a watcher until a random moment in `window` (seconds after they
    start), then SIGKILL; returns what the watcher read."""
    stop = asyncio.Event()
    samples: list[Sample] = []
    first = len(log)
    tasks = [
        asyncio.create_task(
            _produce(server.url, server.token, random.Random(rng.random()), who, log, stop)
        )
        for who in range(PRODUCERS)
    ]
    watcher = asyncio.create_task(_watch(server, log, first, samples))
    await asyncio.sleep(rng.uniform(*window))  # the fault's timing, not a sync point
    server.kill()
    stop.set()
    await asyncio.gather(*tasks, watcher)
    return samples


def _verify(
    data: Path, log: list[Attempt], required: set[str], token: str, seen: set[str]
) -> set[str]:
    """Check the restored vault offline; returns the checkpoint ids it holds. Those in
    `seen` were read back by an earlier round: listed and matched to their attempt, their
    bytes are not read again."""
    by_key = {a.key: a for a in log}
    vault = Vault(data / "vault")
    try:
        present: set[str] = set()
        for ns, _ in vault.namespaces():
            for rec in _listed(vault, ns.name):
                a = by_key[str(rec.metadata["attempt"])]  # an attempt, never something else
                assert a.ns == ns.name
                present.add(rec.id)
                if rec.id in seen:
                    continue
                _, files = vault.manifest(ns.name, rec.id)
                assert set(files) == set(a.files)
                for name, entry in files.items():
                    got = b"".join(vault.reader.chunks([c for c, _ in entry.chunks]))
                    assert got == a.files[name], f"{rec.id}/{name} differs"
        lost = required - present
        assert not lost, f"lost {len(lost)} checkpoints that had to survive: {sorted(lost)[:5]}"
        report = vault.check()
        assert report.ok, report
        assert verify({t.key_id: t for t in vault.tokens.all()}, token)  # tokens came back
    finally:
        vault.close()
    return present


def _listed(vault: Vault, ns: str) -> Iterator[StoredCheckpoint]:
    before: str | None = None
    while True:
        page, before = vault.checkpoints(ns, limit=1000, before=before)
        yield from page
        if before is None:
            return


@pytest.fixture
def replica_env(
    tmp_path: Path, seaweed: SeaweedFS, request: pytest.FixtureRequest
) -> Iterator[tuple[ServerProcess, Path]]:
    mode = request.param
    config = _config(tmp_path / "vault.toml", seaweed, f"replica-{mode}-{SEED}", mode)
    server = ServerProcess(tmp_path / "data", free_port(), tmp_path / "server.log", config)
    try:
        yield server, config
    finally:
        server.stop()


@pytest.mark.parametrize("replica_env", ["async", "sync"], indirect=True)
def test_primary_lost_at_random_moments(
    replica_env: tuple[ServerProcess, Path], seaweed: SeaweedFS, request: pytest.FixtureRequest
) -> None:
    server, config = replica_env
    mode = request.node.callspec.params["replica_env"]
    rng = random.Random(f"{SEED}-{mode}")
    tier = open_tier("cold", f"s3://vault/replica-{mode}-{SEED}", seaweed.options())
    log: list[Attempt] = []
    kept: set[str] = set()
    token = ""
    owed_total = 0  # checkpoints the rounds required to survive
    try:
        for round_no in range(ROUNDS):
            server.start()
            token = token or server.token
            first = len(log)
            samples = asyncio.run(_round(server, rng, log))
            shutil.rmtree(server.data_dir)  # the disk is gone
            # this server's acknowledgements (earlier ones it may lose stay lost)
            acked = {a.checkpoint for a in log[first:] if a.checkpoint is not None}
            must = acked if mode == "sync" else owed(samples)
            assert must <= acked
            owed_total += len(must)
            try:
                if round_no == ROUNDS - 1:  # the last through the CLI, as an operator would
                    _cli_restore(server.data_dir, config)
                else:
                    restore_replica(tier, server.data_dir / "vault")
            except ReplicaNotFound:  # killed before the first base: nothing may be owed
                assert not kept
                assert not must
                token = ""  # the next start is a fresh vault with a new admin token
                continue
            last = round_no == ROUNDS - 1  # the last round reads everything back again
            seen: set[str] = set() if last else kept
            kept = _verify(server.data_dir, log, kept | must, token, seen)
            (server.data_dir / "admin.token").write_text(token + "\n")  # the operator's copy
    except AssertionError:
        print(f"REPLICA_SEED={SEED} mode={mode}\n{server.log_tail()}")
        raise
    assert len(kept) >= ROUNDS  # the rounds did save something
    assert owed_total >= ROUNDS, owed_total  # and the rule had something to hold them to


def _cli_restore(data: Path, config: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "checkpoint_vault.cli", "catalog", "restore", "replica:cold"]
        + ["--data", str(data), "--config", str(config), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("CKPT_")},
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["from"] == "replica:cold"


def _metric(url: str, token: str, name: str) -> float:
    import urllib.request

    req = urllib.request.Request(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_object_store_down_async_keeps_saving_and_catches_up(
    tmp_path: Path, seaweed: SeaweedFS
) -> None:
    """The shared SeaweedFS, killed and started again (as tests/conformance/test_outage.py
    does): a second one beside it would cost a fresh start, and two at once do not start
    cleanly. The lag budget is short so that the lag passes it soon after the outage."""
    weed = seaweed
    prefix = f"outage-{secrets.token_hex(4)}"
    config = _config(tmp_path / "vault.toml", weed, prefix, "async", OUTAGE_LAG_BUDGET)
    server = ServerProcess(tmp_path / "data", free_port(), tmp_path / "server.log", config)
    rng = random.Random(SEED)
    log: list[Attempt] = []
    try:
        server.start()
        asyncio.run(_saves(server, rng, log, 5))
        assert _wait_metric(server, "ckpt_replication_lag_bytes", lambda v: v == 0)
        weed.kill()  # an outage: gone at once
        asyncio.run(_saves(server, rng, log, 10))  # acknowledged with the store down
        assert all(a.checkpoint for a in log), [(a.status, a.key) for a in log]
        assert _metric(server.url, server.token, "ckpt_replication_lag_bytes") > 0
        assert _wait_metric(server, "ckpt_replication_lag_seconds", lambda v: v > OUTAGE_LAG_BUDGET)
        weed.start()
        assert _wait_metric(server, "ckpt_replication_lag_bytes", lambda v: v == 0)
        # Seconds fall to 0 once the replica is restorable past every commit, which after an
        # overflow also waits for the new base: later than the queue empties.
        assert _wait_metric(server, "ckpt_replication_lag_seconds", lambda v: v == 0)
        token = server.token
        server.kill()
        shutil.rmtree(server.data_dir)
        tier = open_tier("cold", f"s3://vault/{prefix}", weed.options())
        restore_replica(tier, server.data_dir / "vault")
        acked = {a.checkpoint for a in log if a.checkpoint is not None}
        assert _verify(server.data_dir, log, acked, token, set()) == acked
    finally:
        server.stop()
        if not weed.running():
            weed.start()


async def _saves(server: ServerProcess, rng: random.Random, log: list[Attempt], n: int) -> None:
    """One producer until `n` more saves are acknowledged."""
    await _produce(server.url, server.token, rng, 0, log, asyncio.Event(), limit=n)


def _wait_metric(server: ServerProcess, name: str, ok: Any) -> bool:
    """Poll /metrics until `ok(value)`, for up to CATCH_UP seconds."""
    deadline = time.monotonic() + CATCH_UP
    while time.monotonic() < deadline:
        if ok(_metric(server.url, server.token, name)):
            return True
        time.sleep(0.1)
    return False
