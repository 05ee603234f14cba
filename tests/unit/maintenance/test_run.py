"""`maintenance.run`: every task runs under the maintenance lock, its duration and figures go
to the recorder, a busy lock is refused without waiting when asked (the schedule), and a
route's run waits for a holder in another process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault import maintenance
from checkpoint_vault.protocol import GcReport
from checkpoint_vault.vault import FakeClock, MaintenanceBusy, Vault, VaultConfig

from ...lockholder import LockHolder, assert_waits_for_holder
from ..vault.helpers import stream_save

Recorded = list[tuple[str, float, bool, dict[str, float]]]


@pytest.fixture
def vault(tmp_path: Path) -> Iterator[Vault]:
    v = Vault(tmp_path / "v", VaultConfig(gc_grace=0.0), FakeClock())
    yield v
    v.close()


def _recorder(into: Recorded) -> maintenance.Recorder:
    return lambda job, seconds, ok, figures: into.append((job, seconds, ok, figures))


def test_a_task_runs_under_the_lock_and_its_figures_are_recorded(vault: Vault) -> None:
    rec = stream_save(vault, "ns", {"w": b"x" * 100_000})
    vault.lifecycle.delete("ns", rec.id)
    vault.store.clock.advance(7 * 3600)  # type: ignore[attr-defined]  # past the upload TTL
    held: list[bool] = []

    def task() -> GcReport:
        held.append(vault.maintenance.held)
        return maintenance.gc(vault)

    recorded: Recorded = []
    report = maintenance.run(vault, "gc", task, record=_recorder(recorded))
    assert held == [True]
    assert not vault.maintenance.held
    assert report.chunks_deleted > 0
    [(job, seconds, ok, figures)] = recorded
    assert (job, ok) == ("gc", True)
    assert seconds >= 0
    assert figures["chunks_deleted"] == report.chunks_deleted
    assert figures == maintenance.figures(report)


def test_a_failing_task_is_recorded_as_failed_and_raises(vault: Vault) -> None:
    def task() -> GcReport:
        raise RuntimeError("disk on fire")

    recorded: Recorded = []
    with pytest.raises(RuntimeError, match="disk on fire"):
        maintenance.run(vault, "gc", task, record=_recorder(recorded))
    assert [(j, ok, f) for j, _, ok, f in recorded] == [("gc", False, {})]
    assert not vault.maintenance.held


def test_the_schedule_does_not_wait_for_a_busy_lock(vault: Vault) -> None:
    holder = LockHolder(vault.path / "maintenance.lock")
    recorded: Recorded = []
    try:
        with pytest.raises(MaintenanceBusy):
            maintenance.run(
                vault, "gc", lambda: maintenance.gc(vault), 0, record=_recorder(recorded)
            )
    finally:
        holder.release()
    assert recorded == []  # the job log counts work, not refusals


def test_a_route_waits_for_a_holder_in_another_process(vault: Vault) -> None:
    assert_waits_for_holder(
        vault, lambda: maintenance.run(vault, "check", lambda: maintenance.check(vault))
    )


@pytest.mark.parametrize(
    "job", ["retention", "gc", "scrub", "compact", "tiering", "catalog_backup", "usage"]
)
def test_every_scheduled_task_waits_for_a_holder_in_another_process(
    vault: Vault, tmp_path: Path, job: str
) -> None:
    """The lock is taken by `run` alone (the engine's operations under a task take it no
    more): each task of the schedule, run through it, still excludes another holder."""
    stream_save(vault, "ns", {"w": b"x" * 100_000})
    tasks = maintenance.scheduled(vault, None, None)
    # No tier here: the backup goes to a path, as `ckpt catalog backup --dest` asks.
    tasks["catalog_backup"] = lambda: maintenance.catalog_backup(vault, str(tmp_path / "b.mdb"))
    assert_waits_for_holder(vault, lambda: maintenance.run(vault, job, tasks[job]))


def test_another_thread_waits_for_a_run_in_this_process(vault: Vault) -> None:
    inside, release = threading.Event(), threading.Event()

    def slow() -> GcReport:
        inside.set()
        release.wait(30)
        return maintenance.gc(vault)

    t = threading.Thread(target=maintenance.run, args=(vault, "gc", slow))
    t.start()
    try:
        assert inside.wait(30)
        with pytest.raises(MaintenanceBusy):
            maintenance.run(vault, "check", lambda: maintenance.check(vault), 0)
    finally:
        release.set()
        t.join(30)
