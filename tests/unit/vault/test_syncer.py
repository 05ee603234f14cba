"""Durability behind the writer (vault/syncer.py): what an acknowledged save survives.

A child process saves and dies without closing (`os._exit`: the page cache keeps every
LMDB write, as after SIGKILL). Power loss is simulated on top of that: the child copies the
LMDB files once its saves are acknowledged (the disk then), stops the syncer inside its
next fdatasync, lets more batches commit unsynced, and dies. Any page written since may or
may not have reached the disk, so the test builds disks mixing old and new pages at random,
and garbles meta pages. Every acknowledged save must come back and `check` must pass.
"""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from checkpoint_vault.vault import Conflict, Unavailable, Vault
from checkpoint_vault.vault.config import VaultConfig
from checkpoint_vault.vault.syncer import DURABLE_FILE, UNWAITED_DELAY
from checkpoint_vault.vault.writer import Writer, WriteTxn

from .powerloss import DATA_FILES, PAGE, mix, overwrite, run_child


def _child(
    vault_dir: Path, acked: int, unacked: int = 0, snapshot: Path | None = None
) -> list[str]:
    """In another process: `acked` saves (their ids printed), then optionally a copy of the
    LMDB files and `unacked` saves committed but never made durable; then die unclosed."""
    return run_child(
        vault_dir,
        f"""
        ids, parent = [], None
        for i in range({acked}):
            rec, _ = v.save("agents/a", {{"state.json": state(i)}}, parent=parent,
                            chunking="small")
            ids.append(rec.id)
            parent = rec.id
        print(json.dumps(ids), flush=True)
        if {str(snapshot) if snapshot else None!r}:
            snapshot({str(vault_dir)!r}, {str(snapshot)!r})
        if {unacked}:
            never = threading.Event()
            vault.syncer.os.fdatasync = lambda fd: never.wait()  # the disk stops here
            # Batches the journal would acknowledge at once: these stay plain, to pile
            # up committed and unsynced behind the syncer (test_journal.py has the rest).
            v.store.writer.journaling = False
            committed = threading.Semaphore(0)
            after = vault.syncer.Syncer.after
            def counted(self, *args, **kwargs):
                after(self, *args, **kwargs)
                committed.release()
            vault.syncer.Syncer.after = counted
            for i in range({unacked}):  # one at a time: each commits its own batch
                threading.Thread(target=v.save, args=("agents/b", {{"s": state(i) * 3}}),
                                 kwargs={{"chunking": "small"}}, daemon=True).start()
                committed.acquire()
        """,
    )


def _assert_ids_there(vault_dir: Path, namespace: str, ids: list[str]) -> None:
    v = Vault(vault_dir)
    try:
        assert v.check().ok
        assert sorted(r.id for r in v.checkpoints(namespace, limit=100)[0]) == sorted(ids)
    finally:
        v.close()


def _assert_all_there(vault_dir: Path, ids: list[str]) -> None:
    v = Vault(vault_dir)
    try:
        for cid in ids:
            rec = v.get("agents/a", cid)
            assert rec.id == cid
            _, files = v.manifest("agents/a", cid)
            data = b"".join(
                bytes(c) for c in v.reader.chunks([c for c, _ in files["state.json"].chunks])
            )
            assert data.startswith(b'[{"role": "user"')
            assert len(data) == files["state.json"].size
        assert v.check().ok
        listed = [r.id for r in v.checkpoints("agents/a", limit=100)[0]]
        assert sorted(listed) == sorted(ids)
    finally:
        v.close()


def test_killed_writer_keeps_every_acknowledged_save(tmp_path: Path) -> None:
    ids = _child(tmp_path / "v", 12, unacked=3)
    _assert_all_there(tmp_path / "v", ids)


@pytest.mark.parametrize("seed", range(4))
def test_power_loss_keeps_every_acknowledged_save(tmp_path: Path, seed: int) -> None:
    """Batches committed after the last durable state wrote pages; any of them may be on
    the disk or not, the newer meta pages among them. Recovery returns to that state."""
    snap = tmp_path / "snap"
    ids = _child(tmp_path / "v", 10, unacked=4, snapshot=snap)
    rng = random.Random(seed)
    for name in DATA_FILES:
        path = tmp_path / "v" / name
        old, new = (snap / name).read_bytes(), path.read_bytes()
        assert old != new or name.startswith("frames")  # the unacknowledged batches wrote
        overwrite(path, mix(old, new, rng))
    _assert_all_there(tmp_path / "v", ids)


def test_nothing_written_since_the_durable_state_reached_the_disk(tmp_path: Path) -> None:
    snap = tmp_path / "snap"
    ids = _child(tmp_path / "v", 8, unacked=2, snapshot=snap)
    for name in DATA_FILES:
        overwrite(tmp_path / "v" / name, (snap / name).read_bytes())
    _assert_all_there(tmp_path / "v", ids)


def test_torn_meta_pages_are_put_back(tmp_path: Path) -> None:
    """A newer meta page on disk whose tree did not make it: recovery must not trust it."""
    ids = _child(tmp_path / "v", 8, unacked=2)
    for name in DATA_FILES:
        path = tmp_path / "v" / name
        raw = bytearray(path.read_bytes())
        for page in (0, 1):
            raw[page * PAGE + 16 : (page + 1) * PAGE] = os.urandom(PAGE - 16)
        overwrite(path, bytes(raw))
    _assert_all_there(tmp_path / "v", ids)


def test_a_durable_state_of_other_files_is_refused(tmp_path: Path) -> None:
    """A catalog put where the recorded files were (another inode, other meta pages) must
    not get their meta pages."""
    _child(tmp_path / "v", 3, unacked=1)
    catalog = tmp_path / "v" / "catalog" / "data.mdb"
    data = catalog.read_bytes()
    other = catalog.with_name("other.mdb")  # written while the old one exists: another inode
    other.write_bytes(data[:16] + os.urandom(16) + data[32:])  # and other meta pages
    other.replace(catalog)
    with pytest.raises(Conflict, match="another data.mdb"):
        Vault(tmp_path / "v")


def test_a_closed_data_dir_copies_and_opens_without_its_durable_file(tmp_path: Path) -> None:
    """A clean close leaves the files synced and equal to the durable state: a copy (other
    inodes) opens as it is, and so does a data dir from before the syncer (no file)."""
    v = Vault(tmp_path / "v")
    rec, _ = v.save("ns", {"f": b"hello" * 100})
    v.close()
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "v", copy)
    (tmp_path / "v" / DURABLE_FILE).unlink()
    for root in (copy, tmp_path / "v"):
        v = Vault(root)
        try:
            _, files = v.manifest("ns", rec.id)
            chunks = [c for c, _ in files["f"].chunks]
            assert b"".join(bytes(c) for c in v.reader.chunks(chunks)) == b"hello" * 100
        finally:
            v.close()


def test_a_failed_sync_fails_the_saves_waiting_on_it_and_every_later_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Linux may drop the pages of a failed fdatasync: nothing after it is acknowledged."""
    v = Vault(tmp_path / "v")
    try:
        kept, _ = v.save("ns", {"f": b"before" * 100})

        def broken(fd: int) -> None:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr("checkpoint_vault.vault.syncer.os.fdatasync", broken)
        with pytest.raises(Unavailable, match="a sync to disk failed"):
            v.save("ns", {"f": b"lost" * 100})
        monkeypatch.undo()
        with pytest.raises(Unavailable, match="restart the service"):
            v.save("ns", {"f": b"after" * 100})
    finally:
        v.close()
    _assert_ids_there(tmp_path / "v", "ns", [kept.id])


def test_a_stalled_disk_holds_pins_of_three_states_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hundreds of batches committed behind one slow sync: each state's pins take LMDB
    reader slots (512), so only the states a cycle can still need keep theirs."""
    v = Vault(tmp_path / "v")
    try:
        writer = v.store.writer
        env = v.store.catalog_env
        db = env.db["counters"]
        entered, resume = threading.Event(), threading.Event()
        real = os.fdatasync

        def slow(fd: int) -> None:
            entered.set()
            assert resume.wait(60)
            real(fd)

        monkeypatch.setattr("checkpoint_vault.vault.syncer.os.fdatasync", slow)
        durable = []

        def put(key: bytes) -> Callable[[WriteTxn], object]:
            return lambda w: w.catalog.put(key, b"1", db=db)

        for i in range(400):  # each staged op returns once its own batch committed
            _, done = writer.stage(put(b"stall-%d" % i))
            durable.append(done)
            if i == 0:
                assert entered.wait(60)  # the syncer is stuck in the first cycle
        readers = env.lmdb.readers()
        resume.set()
        for done in durable:
            done.result(timeout=60)
        assert readers.count("\n") < 20, readers
    finally:
        v.close()


@pytest.mark.parametrize("kind", ["one-request save", "upload commit"])
def test_a_retry_is_answered_only_once_the_first_attempt_is_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The retry finds the first attempt (its idempotency key, its session marked committed)
    from its commit on, before that commit is durable: answering then would acknowledge
    what a crash can still take back."""
    from concurrent.futures import ThreadPoolExecutor

    v = Vault(tmp_path / "v")
    try:
        session, _ = v.open_upload("ns")

        def attempt() -> tuple[Any, bool]:
            if kind == "upload commit":
                return v.committer.commit(session.id)
            return v.save("ns", {"s": b"state" * 100}, key="retried-save-0001")

        resume = threading.Event()
        real = os.fdatasync
        monkeypatch.setattr(
            "checkpoint_vault.vault.syncer.os.fdatasync", lambda fd: resume.wait(60) and real(fd)
        )
        committed, queued = threading.Semaphore(0), threading.Semaphore(0)
        journal, enqueue = Writer._journal, Writer._enqueue

        def journaling(self: Writer, *args: Any) -> bool:  # a batch committed: not durable
            committed.release()  # yet, by the journal's sync (a save) or the syncer's
            return journal(self, *args)

        def enqueuing(self: Writer, *args: Any) -> Any:
            item = enqueue(self, *args)
            queued.release()
            return item

        monkeypatch.setattr(Writer, "_journal", journaling)
        monkeypatch.setattr(Writer, "_enqueue", enqueuing)
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(attempt)
            assert committed.acquire(timeout=60)  # its batch committed, not durable
            retry = pool.submit(attempt)
            assert queued.acquire(timeout=60)  # the first attempt's batch
            assert queued.acquire(timeout=60)  # the retry's wait for durability
            assert not retry.done()
            assert not first.done()
            resume.set()
            rec, created = first.result(60)
            again, created_again = retry.result(60)
        assert created
        assert not created_again
        assert again.id == rec.id
    finally:
        v.close()


def test_a_batch_the_syncer_cannot_take_fails_its_callers_not_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pinning a state needs LMDB reader slots; without one the batch's callers get the
    error and the writer goes on."""
    import lmdb

    from checkpoint_vault.vault.syncer import Syncer

    v = Vault(tmp_path / "v", VaultConfig(save_journal=False))  # the journal would answer
    try:
        capture = Syncer.capture

        def full(self: Syncer, *args: Any) -> Any:
            monkeypatch.setattr(Syncer, "capture", capture)  # once
            raise lmdb.ReadersFullError("no reader slot")

        monkeypatch.setattr(Syncer, "capture", full)
        with pytest.raises(lmdb.ReadersFullError):
            v.save("ns", {"f": b"refused" * 100})
        rec, created = v.save("ns", {"f": b"kept" * 100})
        assert created
    finally:
        v.close()
    v = Vault(tmp_path / "v")  # the refused batch was committed: the next cycle kept it too
    try:
        listed = [r.id for r in v.checkpoints("ns", limit=10)[0]]
        assert rec.id in listed
        assert len(listed) == 2
        assert v.check().ok
    finally:
        v.close()


def test_journaled_saves_share_a_later_cycle_and_a_waiter_gets_one_at_once(
    tmp_path: Path,
) -> None:
    """Saves acknowledged by their journal records leave their catalog state to a cycle
    up to UNWAITED_DELAY later, one for all of them (PostgreSQL's data pages after its WAL),
    where each used to get one; a batch somebody waits for is synced at once."""
    v = Vault(tmp_path / "v")
    try:
        syncer = v.store.writer._syncer
        v.store.writer.wait_durable()
        before = syncer.cycles
        saves = 20
        started = time.monotonic()
        for i in range(saves):
            v.save("ns", {"f": bytes([i]) * 3000}, chunking="small")
        # One per UNWAITED_DELAY of saves at most (15-17 of 20 with a cycle per batch).
        most = (time.monotonic() - started) / UNWAITED_DELAY + 2
        assert syncer.cycles - before <= min(most, saves // 2)
        started = time.monotonic()
        v.store.writer.wait_durable()  # a plain batch: its callers wait, so it goes at once
        assert time.monotonic() - started < 5.0
        assert syncer.durable_batch == v.store.writer._batch
        assert list(v.store.writer.journal.pending()) == []
    finally:
        v.close()
