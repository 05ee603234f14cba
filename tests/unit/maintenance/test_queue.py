"""`MaintenanceQueue`: tasks run one at a time on the runtime's `vault-maintenance` thread
through `maintenance.run`; the queue is bounded; `stop` fails what waits and stops a paced
task at its next step (vault/pacing.py); `timeout=0` waits for nothing, the queue included."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault import maintenance
from checkpoint_vault.protocol import CheckReport
from checkpoint_vault.vault import (
    FakeClock,
    InvalidRequest,
    MaintenanceBusy,
    MaintenanceStopped,
    Vault,
    VaultConfig,
)
from checkpoint_vault.vault.pacing import Pacer
from checkpoint_vault.vault.runtime import Runtime

WAIT = 30.0  # seconds: a bound on each wait below, never a pace


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[maintenance.MaintenanceQueue]:
    vault = Vault(tmp_path / "v", VaultConfig(map_size=1 << 20), FakeClock())
    runtime = Runtime()
    q = maintenance.MaintenanceQueue(vault, runtime.thread, limit=3)
    try:
        yield q
    finally:
        q.close(WAIT)
        runtime.close()
        vault.close()


def test_tasks_run_in_order_on_the_maintenance_thread(
    queue: maintenance.MaintenanceQueue,
) -> None:
    ran: list[tuple[str, str]] = []

    def task(name: str) -> CheckReport:
        ran.append((name, threading.current_thread().name))
        return maintenance.check(queue.vault)

    futures = [queue.submit(n, functools.partial(task, n)) for n in ("a", "b", "c")]
    assert all(f.result(WAIT).ok for f in futures)
    assert ran == [(n, "vault-maintenance") for n in ("a", "b", "c")]


def test_a_full_queue_refuses_and_stop_fails_what_waits(
    queue: maintenance.MaintenanceQueue,
) -> None:
    vault = queue.vault
    with vault.maintenance.hold("verify"):  # another run: the queue's first task waits
        running = queue.submit("check", lambda: maintenance.check(vault))
        assert vault.maintenance.wait_for_waiters(1, WAIT)
        waiting = [queue.submit("gc", lambda: maintenance.gc(vault)) for _ in range(3)]
        assert queue.wait_for_queued(3, WAIT)
        with pytest.raises(MaintenanceBusy, match="3 maintenance tasks are already waiting"):
            queue.submit("gc", lambda: maintenance.gc(vault))
        with pytest.raises(MaintenanceBusy, match=r"busy \(check is running\)"):
            queue.submit("gc", lambda: maintenance.gc(vault), timeout=0)
        queue.stop()
        for f in waiting:
            with pytest.raises(MaintenanceStopped):
                f.result(WAIT)
        with pytest.raises(MaintenanceStopped):
            queue.submit("gc", lambda: maintenance.gc(vault))
    assert running.result(WAIT).ok  # the running one was not paced: it finishes
    assert queue.finished.result(WAIT) is None  # and the thread ends


def test_a_stopped_pacer_does_not_sleep_out_its_rate() -> None:
    stop = threading.Event()
    pacer = Pacer("compact", rate=1.0, stop=stop)
    stop.set()
    with pytest.raises(MaintenanceStopped, match="compact stopped"):
        pacer.pace(10**12)  # ~30,000 years ahead of 1 B/s: the wait returns at once


def test_rates_below_the_minimum_are_refused() -> None:
    assert maintenance.check_rate(None) is None
    assert maintenance.check_rate(maintenance.MIN_RATE) == maintenance.MIN_RATE
    with pytest.raises(InvalidRequest, match="at least 1048576"):
        maintenance.check_rate(1.0)
