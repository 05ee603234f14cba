"""SIGKILL among several server processes (`ckpt serve --workers 2`) while agents save.

Producer threads save small checkpoints (one-request saves, retried by the client with
their idempotency key) through fresh clients, so their connections land on either
process. Each round SIGKILLs, at a seeded random moment while saves are under way, one of:
- the worker: the writing process keeps serving, a new worker is started, and the
  clients' retries succeed;
- the writing process: its worker dies with it; the service is started again;
- both at once.
After every round every acknowledged save must be listed and read back bit-identical
through both processes, and after the last one `check` must be clean. An attempt that
failed (its answer lost) may or may not exist, but if it exists it must read back whole,
and no save's bytes are in two checkpoints (a retry returns the first commit).

A kill must land while saves are in flight (asserted at the moment of the kill). When only
the worker dies the service never stops, so every save must be answered: the answers the
kill lost are retried by the client to their single commit. A worker round is repeated (at
most `WORKER_KILLS` times) until a retry was seen, so the test cannot pass on kills that
happened to catch no request; with the client's retries off (`RETRY = RetryPolicy(
attempts=1)`) it fails.

Rounds: `CKPT_FAULT_ROUNDS` (default 1 per kind in the suite, which must stay under 10
minutes; the closing figures use 20).
Seed: `CRASH_SEED`.
"""

from __future__ import annotations

import os
import random
import signal
import threading
from dataclasses import dataclass, field

import pytest

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.errors import ClientError
from checkpoint_vault.client.transport import RetryPolicy

from ..serverproc import ServerProcess

SEED = int(os.environ.get("CRASH_SEED", "20261127"))
ROUNDS = int(os.environ.get("CKPT_FAULT_ROUNDS", "1"))
PRODUCERS = 4
MAX_KILL_DELAY = 0.4  # seconds into a round's saves
ROUND_SAVES = 400  # per producer: a bound; rounds end long before
WORKER_KILLS = 6  # worker rounds at most, until one caught a request in flight on it


@dataclass(frozen=True)
class CountingRetry(RetryPolicy):
    """The client's own policy, noting each retry it grants (the client's extension
    point, not a stand-in: the waits and limits are RetryPolicy's)."""

    granted: list[int] = field(default_factory=list)

    def wait(self, attempt: int, elapsed: float, retry_after: float | None) -> float | None:
        wait = super().wait(attempt, elapsed, retry_after)
        if wait is not None:
            self.granted.append(attempt)
        return wait


RETRY = CountingRetry()


@dataclass
class Ledger:
    acked: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # id -> (ns, bytes)
    lost: list[tuple[str, bytes]] = field(default_factory=list)  # answers never seen
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0  # saves sent and not yet answered
    at_kills: list[int] = field(default_factory=list)  # in_flight when each kill was sent


def _produce(server: ServerProcess, me: int, ledger: Ledger, stop: threading.Event) -> None:
    rng = random.Random(SEED * 31 + me + 1000 * len(ledger.acked))
    ns = f"agents/p{me}"
    with VaultClient(server.url, server.token, local_files=False, connections=2, retry=RETRY) as c:
        for n in range(ROUND_SAVES):
            if stop.is_set():
                return
            data = rng.randbytes(rng.randint(200, 6000)) + f"#{me}.{n}.{len(ledger.acked)}".encode()
            with ledger.lock:
                ledger.in_flight += 1
            try:
                ckpt = c.save(ns, {"state.json": data}, chunking="small")
            except (ClientError, OSError):
                with ledger.lock:
                    ledger.lost.append((ns, data))
                continue
            finally:
                with ledger.lock:
                    ledger.in_flight -= 1
            with ledger.lock:
                ledger.acked[ckpt.id] = (ns, data)


def _kill(pid: int, ledger: Ledger) -> None:
    with ledger.lock:
        ledger.at_kills.append(ledger.in_flight)
    os.kill(pid, signal.SIGKILL)


def _round(server: ServerProcess, rng: random.Random, victim: str, ledger: Ledger) -> None:
    stop = threading.Event()
    threads = [
        threading.Thread(target=_produce, args=(server, p, ledger, stop), daemon=True)
        for p in range(PRODUCERS)
    ]
    for t in threads:
        t.start()
    stop.wait(rng.uniform(0.05, MAX_KILL_DELAY))  # a seeded moment into the saves
    workers = server.worker_pids()
    if victim == "worker":
        assert workers, "no worker to kill"
        _kill(workers[0], ledger)
        stop.wait(rng.uniform(0.05, MAX_KILL_DELAY))  # saves go on meanwhile
    elif victim == "both":
        for w in workers:
            _kill(w, ledger)
    if victim != "worker":
        assert server.pid is not None
        _kill(server.pid, ledger)
        server.kill()  # reaps it
    stop.set()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a producer hung"
    if victim != "worker":
        server.start()


def _verify(server: ServerProcess, ledger: Ledger) -> None:
    for _ in range(2):  # fresh clients, several connections: both processes read
        with VaultClient(server.url, server.token, local_files=False, connections=4) as c:
            for ckpt_id, (ns, data) in ledger.acked.items():
                assert c.read_range(ns, ckpt_id, "state.json", 0, 1 << 20) == data, ckpt_id
            listed = [(p, i) for p in range(PRODUCERS) for i in _every_id(c, f"agents/p{p}")]
            assert set(ledger.acked) <= {i for _, i in listed}
            known = {data for _, data in ledger.acked.values()} | {d for _, d in ledger.lost}
            holding: dict[bytes, str] = {data: i for i, (_, data) in ledger.acked.items()}
            for p, ckpt_id in listed:
                if ckpt_id not in ledger.acked:
                    data = c.read_range(f"agents/p{p}", ckpt_id, "state.json", 0, 1 << 20)
                    assert data in known, f"{ckpt_id} holds bytes nobody sent"
                    assert data not in holding, f"{ckpt_id} and {holding[data]}: one save twice"
                    holding[data] = ckpt_id


def _every_id(c: VaultClient, ns: str) -> list[str]:
    """Every live checkpoint of `ns`, page by page (20 rounds make more than a page)."""
    ids: list[str] = []
    while page := c.list(ns, limit=1000, before=ids[-1] if ids else None):
        ids += [x.id for x in page]
    return ids


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["worker", "writer", "both"])
def test_sigkill_among_processes_loses_no_acknowledged_save(
    two_processes: ServerProcess, victim: str
) -> None:
    service = two_processes
    rng = random.Random(f"{SEED}-{victim}")
    ledger = Ledger()
    retries = len(RETRY.granted)
    rounds = 0
    while rounds < ROUNDS or (
        victim == "worker" and len(RETRY.granted) == retries and rounds < WORKER_KILLS
    ):
        _round(service, rng, victim, ledger)
        _verify(service, ledger)
        rounds += 1
    retried = len(RETRY.granted) - retries
    print(
        f"CRASH_SEED={SEED} {victim}: {rounds} rounds, {len(ledger.acked)} acked, "
        f"{len(ledger.lost)} answers lost, {retried} retries, in flight at the kills "
        f"{ledger.at_kills}"
    )
    assert ledger.acked, "no save was acknowledged"
    assert all(ledger.at_kills), f"a kill landed with no save in flight: {ledger.at_kills}"
    if victim == "worker":  # the service never stopped: every lost answer was retried
        assert not ledger.lost, f"{len(ledger.lost)} saves failed although the writer lived"
        assert retried, f"{rounds} worker kills caught no request in flight on the worker"
    with VaultClient(service.url, service.token) as c:
        report = c.check()
    assert report.ok, report
