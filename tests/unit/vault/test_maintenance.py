"""The maintenance lock excludes a second holder across threads and across processes, and
the offline restore takes it (the other maintenance operations run under `maintenance.run`'s
hold: tests/unit/maintenance/test_run.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from checkpoint_vault.vault import FakeClock, MaintenanceBusy, MaintenanceLock, Vault, VaultConfig
from checkpoint_vault.vault.backup import restore

from ...lockholder import LockHolder
from .helpers import stream_save


def test_a_second_thread_is_refused_then_gets_it(tmp_path: Path) -> None:
    lock = MaintenanceLock.of(tmp_path)
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with lock.hold("gc"):
            held.set()
            release.wait(30)

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert held.wait(10)
        with (
            pytest.raises(MaintenanceBusy, match="gc is running in this process"),
            lock.hold("verify", timeout=0),
        ):
            pass
        started = time.monotonic()
        with pytest.raises(MaintenanceBusy), lock.hold("verify", timeout=0.2):
            pass
        assert time.monotonic() - started >= 0.2
    finally:
        release.set()
        t.join(10)
    with lock.hold("verify", timeout=0):
        assert lock.held


def test_a_waiting_thread_runs_when_the_holder_is_done(tmp_path: Path) -> None:
    lock = MaintenanceLock.of(tmp_path)
    order: list[str] = []
    with lock.hold("first"):
        waiter = threading.Thread(target=_hold_and_note, args=(lock, order))
        waiter.start()
        assert lock.wait_for_waiters(1, 10)  # it is blocked on the lock, not merely late
        assert order == []
        order.append("first done")
    waiter.join(10)
    assert order == ["first done", "second"]


def _hold_and_note(lock: MaintenanceLock, order: list[str]) -> None:
    with lock.hold("second"):
        order.append("second")


def test_the_lock_counts_its_waiters(tmp_path: Path) -> None:
    """Threads blocked on either half are counted while they wait; one that will not wait
    (timeout=0) never is, and a waiter that gives up or gets the lock is no longer."""
    lock = MaintenanceLock.of(tmp_path)
    assert lock.waiters == 0
    assert not lock.wait_for_waiters(1, 0)
    with lock.hold("first"):
        tried: list[str] = []
        refused = threading.Thread(target=_try_at_once, args=(lock, tried))
        refused.start()
        refused.join(10)
        assert tried == ["refused"]
        assert lock.waiters == 0
        waiter = threading.Thread(target=_hold_and_note, args=(lock, []))
        waiter.start()
        assert lock.wait_for_waiters(1, 10)
        assert lock.waiters == 1
    waiter.join(10)
    assert lock.waiters == 0
    holder = LockHolder(lock.path)  # the other process's half: a waiter too, till it gives up
    try:
        with pytest.raises(MaintenanceBusy), lock.hold("polls", timeout=0.1):
            pass
        assert lock.waiters == 0
    finally:
        holder.release()


def _try_at_once(lock: MaintenanceLock, out: list[str]) -> None:
    try:
        with lock.hold("at once", timeout=0):
            out.append("held")
    except MaintenanceBusy:
        out.append("refused")


def test_reentrant_in_one_thread(tmp_path: Path) -> None:
    lock = MaintenanceLock.of(tmp_path)
    with lock.hold("gc", timeout=0), lock.hold("repack", timeout=0):
        assert lock.held
    assert not lock.held


def test_another_process_excludes_and_is_named(tmp_path: Path) -> None:
    lock = MaintenanceLock.of(tmp_path)
    holder = LockHolder(lock.path)
    try:
        with pytest.raises(MaintenanceBusy) as info, lock.hold("check", timeout=0):
            pass
        assert f"process {holder.pid}" in str(info.value)
        assert "held by a test" in str(info.value)
        assert info.value.status == 409
        assert info.value.code == "conflict"
        assert not lock.held  # a refused attempt leaves nothing behind in this process
    finally:
        holder.release()
    with lock.hold("check", timeout=5):
        pass


def test_a_killed_holder_never_blocks_its_successor(tmp_path: Path) -> None:
    lock = MaintenanceLock.of(tmp_path)
    LockHolder(lock.path).kill()
    with lock.hold("gc", timeout=5):
        pass


def test_restore_refuses_while_the_data_dir_is_under_maintenance(tmp_path: Path) -> None:
    source = Vault(tmp_path / "src", VaultConfig(), FakeClock())
    try:
        stream_save(source, "ns", {"w": b"y" * 1000})
        source.backup_catalog(tmp_path / "cat.mdb")
    finally:
        source.close()
    raw = (tmp_path / "cat.mdb").read_bytes()
    target = tmp_path / "new" / "vault"
    target.mkdir(parents=True)
    holder = LockHolder(target / "maintenance.lock")
    try:
        with pytest.raises(MaintenanceBusy):
            restore(raw, target)
    finally:
        holder.release()
    assert restore(raw, target)["lost_hot_chunks"] > 0
