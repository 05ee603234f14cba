"""The save journal (vault/journal.py): saves it acknowledged survive a crash that takes
every catalog page written after the last durable state; its file format and its rule of
when a batch may be journaled.

The crash test runs in a child process that dies without closing (`os._exit`). It makes
the catalog durable and copies the LMDB files (the disk then), stops the syncer for good,
and saves more: each of those is acknowledged by its journal record alone. The test then
builds disks mixing the copy with the pages written since, at random, as a power loss
would leave them, and reopens: every acknowledged save must be back, with its id.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import blake3
import pytest

from checkpoint_vault.protocol import decode_bundle, encode_bundle
from checkpoint_vault.vault import Vault
from checkpoint_vault.vault.direct import RECORD_OF_CHUNKS
from checkpoint_vault.vault.frame import chunk_id
from checkpoint_vault.vault.ids import IdGenerator
from checkpoint_vault.vault.journal import _HEAD, AHEAD, ALLOC_STEP, SHRINK_ABOVE, Journal
from checkpoint_vault.vault.manifest import FileEntry
from checkpoint_vault.vault.syncer import Syncer
from checkpoint_vault.vault.writer import Writer

from .powerloss import DATA_FILES, mix, overwrite, run_child


def _child(vault_dir: Path, synced: int, journaled: int, snapshot: Path) -> list[str]:
    """`synced` saves made durable in the catalog, a copy of the LMDB files, then
    `journaled` saves with the syncer stopped; returns every acknowledged id in order."""
    return run_child(
        vault_dir,
        f"""
        ids, parent = [], None
        def save(i):
            global parent
            rec, created = v.save("agents/a", {{"state.json": state(i)}}, parent=parent,
                                  chunking="small", metadata={{"step": i}}, tags=[f"s{{i}}"])
            assert created
            ids.append(rec.id)
            parent = rec.id
        for i in range({synced}):
            save(i)
        v.store.writer.wait_durable()
        snapshot({str(vault_dir)!r}, {str(snapshot)!r})
        never = threading.Event()
        vault.syncer.Syncer._make_durable = lambda *a: never.wait()  # the catalog stops here
        for i in range({synced}, {synced + journaled}):
            save(i)
        print(json.dumps(ids), flush=True)
        """,
    )


@pytest.mark.parametrize("seed", range(3))
def test_journal_acknowledged_saves_survive_losing_every_later_page(
    tmp_path: Path, seed: int
) -> None:
    snap, vdir = tmp_path / "snap", tmp_path / "v"
    ids = _child(vdir, 5, 12, snap)
    records = [decode_bundle(p) for _, p in Journal(vdir / "journal", applied=0).pending()]
    rng = random.Random(seed)
    for name in DATA_FILES:
        path = vdir / name
        old, new = (snap / name).read_bytes(), path.read_bytes()
        overwrite(path, mix(old, new, rng) if seed else old)  # seed 0: none reached it
    v = Vault(vdir)
    try:
        assert v.check().ok
        listed = [r.id for r in v.checkpoints("agents/a", limit=100)[0]]
        assert listed == list(reversed(ids))  # every one, newest first, ids as acknowledged
        for step, cid in enumerate(ids):
            rec = v.get("agents/a", cid)
            assert rec.metadata == {"step": step}
            assert rec.tags == [f"s{step}"]
            assert rec.parent == (ids[step - 1] if step else None)
            _, files = v.manifest("agents/a", cid)
            chunks = [c for c, _ in files["state.json"].chunks]
            data = b"".join(bytes(c) for c in v.reader.chunks(chunks))
            assert json.loads(data)[-1]["content"].endswith(str(step + 19))
        # Each journaled save's record holds its chunk list and the chunks it stored, not
        # the state: a grown state shares all but its tail with the one before.
        for (header, parts), step in zip(records[-12:], range(5, 17), strict=True):
            assert header["id"] == ids[step]
            assert header["v"] == RECORD_OF_CHUNKS
            held = sum(len(b) for b in parts.values())
            assert held < v.get("agents/a", ids[step]).size / 4
        after, _ = v.save("agents/a", {"state.json": b"[]"}, parent=ids[-1])
        assert after.id > ids[-1]  # ids go on after the ones applied again
    finally:
        v.close()
    v = Vault(vdir)  # applied once: the durable state now holds them, nothing comes twice
    try:
        assert len(v.checkpoints("agents/a", limit=100)[0]) == len(ids) + 1
    finally:
        v.close()


def test_a_save_after_an_unsynced_plain_batch_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A journal record is applied again on the durable state plus the records before it,
    so a save is not journaled while a change that is not in the journal is still
    unsynced: its answer waits for that change's sync."""
    resume, entered = threading.Event(), threading.Event()
    v = Vault(tmp_path / "v")
    try:
        v.save("ns", {"f": b"first"})  # journaled
        # Its catalog cycle may still run: the slow sync below must be the plain batch's.
        v.store.writer.wait_durable()
        make_durable = Syncer._make_durable

        def slow(self: Syncer, *args: Any) -> None:
            entered.set()
            assert resume.wait(60)
            make_durable(self, *args)

        monkeypatch.setattr(Syncer, "_make_durable", slow)
        plain = v.store.writer.submit(lambda w: None)  # not journaled: waits for the sync
        assert entered.wait(60)
        decided: list[bool] = []
        batch_ran = threading.Event()
        journal = Writer._journal

        def deciding(self: Writer, *args: Any) -> bool:
            decided.append(journal(self, *args))
            batch_ran.set()
            return decided[-1]

        monkeypatch.setattr(Writer, "_journal", deciding)
        with ThreadPoolExecutor(1) as pool:
            second = pool.submit(v.save, "ns", {"f": b"second"})
            assert batch_ran.wait(60)  # the save's batch committed (the only one queued)
            assert decided == [False]  # and was not journaled
            assert not second.done()
            assert not plain.done()
            resume.set()
            assert plain.result(60) is None
            assert second.result(60)[1]
    finally:
        resume.set()
        v.close()


def test_records_after_applied_come_back_in_order_and_a_torn_tail_is_dropped(
    tmp_path: Path,
) -> None:
    j = Journal(tmp_path / "j", applied=0)
    assert j.append([b"one", b"two"]) == 2
    assert j.append([b"three"]) == 3
    j.close()
    (log,) = sorted((tmp_path / "j").iterdir())
    with log.open("ab") as f:
        f.write(b"CVJ1" + b"\x04" * 20)  # a record the crash cut short: never acknowledged
    j = Journal(tmp_path / "j", applied=1)
    assert list(j.pending()) == [(2, b"two"), (3, b"three")]
    assert j.last == 3
    assert j.append([b"four"]) == 4  # into a new file, after the torn bytes' file
    j.close()
    assert [p for _, p in Journal(tmp_path / "j", applied=0).pending()] == [
        b"one",
        b"two",
        b"three",
        b"four",
    ]


def test_a_changed_record_is_not_applied(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j", applied=0)
    j.append([b"a" * 100, b"b" * 100])
    j.close()
    (log,) = (tmp_path / "j").iterdir()
    raw = bytearray(log.read_bytes())
    raw[2 * (_HEAD.size + 100) - 1] ^= 1  # the second record's last byte
    log.write_bytes(bytes(raw))
    assert list(Journal(tmp_path / "j", applied=0).pending()) == [(1, b"a" * 100)]


def test_files_a_durable_state_covers_are_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("checkpoint_vault.vault.journal.FILE_BYTES", 100)  # a file per append
    j = Journal(tmp_path / "j", applied=0)
    for n in range(4):
        j.append([bytes([n]) * 150])
    assert len(list((tmp_path / "j").iterdir())) == 4
    j.trim(2)  # the files of records 1 and 2 go; 3's stays, and the one being written
    assert [p for _, p in j.pending()] == [bytes([2]) * 150, bytes([3]) * 150]
    assert len(list((tmp_path / "j").iterdir())) == 2
    j.trim(4)
    assert len(list((tmp_path / "j").iterdir())) == 1  # the open file stays
    j.close()


def test_a_new_durable_file_discards_a_journal_of_other_files(tmp_path: Path) -> None:
    """A restored catalog comes without its durable file: records of the files it
    replaced must not be applied to it."""
    v = Vault(tmp_path / "v")
    v.save("ns", {"f": b"x"})
    v.close()
    (tmp_path / "v" / "durable").unlink()
    (tmp_path / "v" / "journal" / "extra.log").write_bytes(b"not for these files")
    v = Vault(tmp_path / "v")
    try:
        assert not (tmp_path / "v" / "journal" / "extra.log").exists()
        assert len(v.checkpoints("ns")[0]) == 1
    finally:
        v.close()


def test_an_idle_vault_keeps_one_allocation_step_of_journal(tmp_path: Path) -> None:
    v = Vault(tmp_path / "v")
    try:
        for i in range(20):
            v.save("ns", {"f": bytes([i]) * 5000})
        v.store.writer.wait_durable()  # a cycle after the last record: it holds them all
        files = list((tmp_path / "v" / "journal").iterdir())
        assert [f.stat().st_blocks * 512 for f in files] == [ALLOC_STEP]
        assert list(v.store.writer.journal.pending()) == []
    finally:
        v.close()


def test_records_written_over_an_earlier_round_end_where_the_new_ones_do(
    tmp_path: Path,
) -> None:
    """Once a durable state holds every record, the file is written again from its start;
    the earlier round's records after the new ones are not read back, even with nothing
    applied, and the file's size never changed for any of these syncs."""
    j = Journal(tmp_path / "j", applied=0)
    for n in range(10):
        j.append([bytes([n]) * 300])
    (log,) = (tmp_path / "j").iterdir()
    assert log.stat().st_size == ALLOC_STEP
    j.trim(10)
    assert j.append([b"x" * 40, b"y" * 40]) == 12  # shorter: old bytes follow them
    j.close()
    assert log.stat().st_size == ALLOC_STEP
    assert list(Journal(tmp_path / "j", applied=0).pending()) == [(11, b"x" * 40), (12, b"y" * 40)]


def test_streaming_appends_sync_allocated_blocks_the_syncer_put_ahead(tmp_path: Path) -> None:
    """Saves that never let a durable state catch up with the newest record (a steady
    stream) never start the file over: the syncer's trims keep zeros ahead of the records,
    so no append changes the file's size (a sync that does commits the file system's own
    journal too: every other 30 kB save paid for it)."""
    j = Journal(tmp_path / "j", applied=0)
    record = bytes(range(256)) * 120  # ~30 kB: an agent's state saved without a parent
    j.append([record])
    (log,) = (tmp_path / "j").iterdir()
    grown_by_appends = 0
    for n in range(2, 60):
        j.trim(n - 2)  # the syncer's cycle: a durable state one record behind
        before = log.stat().st_size
        j.append([record])
        grown_by_appends += log.stat().st_size != before
    assert grown_by_appends == 0
    assert log.stat().st_size <= 59 * len(record) + AHEAD + ALLOC_STEP
    j.close()
    assert [seq for seq, _ in Journal(tmp_path / "j", applied=40).pending()] == list(range(41, 60))


def test_a_burst_grows_the_file_and_the_next_round_gives_it_back(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j", applied=0)
    for n in range(6):
        j.append([bytes([n]) * ALLOC_STEP])
    (log,) = (tmp_path / "j").iterdir()
    assert log.stat().st_size > SHRINK_ABOVE
    j.trim(6)
    assert log.stat().st_size == ALLOC_STEP
    j.append([b"after"])
    j.close()
    assert [p for _, p in Journal(tmp_path / "j", applied=6).pending()] == [b"after"]


def test_records_of_whole_files_still_apply_and_one_lacking_a_chunk_is_refused(
    tmp_path: Path,
) -> None:
    """A journal written before records held chunks (whole files, no "v") is applied at
    the next open; a record naming a chunk it does not hold and the vault lacks is not
    applied (it would make a checkpoint that cannot be read), and the records after it
    still are."""
    v = Vault(tmp_path / "v")
    v.save("ns", {"f": b"first"})
    with v.store.catalog_env.read() as txn:
        ns = v.store.catalog.namespace(txn, "ns")
        assert ns is not None
        profile = dataclasses.asdict(ns.chunking())
    ids = IdGenerator()
    now = time.time()
    old, lacking = ids.next(int(now * 1000) + 1), ids.next(int(now * 1000) + 2)
    header: dict[str, Any] = {"ns": "ns", "parent": None, "created_at": now, "inherit": False}
    header |= {"metadata": {}, "tags": [], "key": None, "by": None, "profile": profile}
    data = b"never stored " * 100
    entry = FileEntry(len(data), blake3.blake3(data).digest(), ((chunk_id(data), len(data)),))
    v.store.writer.journal.append(
        [
            encode_bundle(
                {**header, "id": lacking, "v": RECORD_OF_CHUNKS}, [("e/f", entry.to_bytes())]
            ),
            encode_bundle({**header, "id": old}, [("f", b"a whole file, as before")]),
        ]
    )
    v.close()
    v = Vault(tmp_path / "v")
    try:
        assert [r.id for r in v.checkpoints("ns")[0]][0] == old
        assert lacking not in {r.id for r in v.checkpoints("ns")[0]}
        _, files = v.manifest("ns", old)
        chunks = [c for c, _ in files["f"].chunks]
        assert b"".join(bytes(c) for c in v.reader.chunks(chunks)) == b"a whole file, as before"
        assert v.check().ok
    finally:
        v.close()


def test_records_an_earlier_version_wrote_are_read(tmp_path: Path) -> None:
    """A file of CVJ1 records (a save's whole files, before) is read like one of CVJ2 (its
    chunks); the digest covers sequence and payload, so only the magic differs."""
    old = [b"a save's whole files", b"another"]
    j = Journal(tmp_path / "j", applied=0)
    j.append(old)
    j.close()
    (log,) = (tmp_path / "j").iterdir()
    log.write_bytes(log.read_bytes().replace(b"CVJ2", b"CVJ1"))
    j = Journal(tmp_path / "j", applied=0)
    assert [p for _, p in j.pending()] == old
    assert j.append([b"new"]) == 3
    j.close()
    assert [p for _, p in Journal(tmp_path / "j", applied=1).pending()] == [old[1], b"new"]


class _FailingOnce:
    """The journal's append, failing its next call with `errno` (a fault injected by
    wrapping, as a file system out of descriptors or a bad disk would fail it)."""

    def __init__(self, journal: Journal, error: int) -> None:
        self._append = journal.append
        self._error = error
        self.failed = 0

    def __call__(self, payloads: list[bytes]) -> int:
        if not self.failed:
            self.failed += 1
            raise OSError(self._error, os.strerror(self._error))
        return self._append(payloads)


@pytest.mark.parametrize(("error", "stays_on"), [(errno.EMFILE, True), (errno.EIO, False)])
def test_only_a_lasting_append_error_switches_the_journal_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: int, stays_on: bool
) -> None:
    """A batch whose records cannot be appended waits for the catalog's sync instead.
    Out of descriptors (EMFILE, ENFILE) passes: the journal stays on and acknowledges the
    next batch (before, a flood of connections switched it off until a restart); a disk
    error switches it off."""
    v = Vault(tmp_path / "v")
    try:
        writer = v.store.writer
        failing = _FailingOnce(writer.journal, error)
        monkeypatch.setattr(writer.journal, "append", failing)
        first, _ = v.save("ns", {"f": b"first"})  # records failed: acknowledged by the sync
        assert failing.failed == 1
        assert writer.journal_on() is stays_on
        journaled = writer.stats.journaled_batches
        second, _ = v.save("ns", {"f": b"second"}, parent=first.id)
        assert (writer.stats.journaled_batches > journaled) is stays_on
        assert v.get("ns", "latest").id == second.id
    finally:
        v.close()
