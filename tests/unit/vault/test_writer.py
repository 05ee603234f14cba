from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.vault import VaultError
from checkpoint_vault.vault.env import FRAME_DBS, Env
from checkpoint_vault.vault.runtime import Runtime
from checkpoint_vault.vault.syncer import Syncer
from checkpoint_vault.vault.writer import Writer, WriteTxn


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path / "db", map_size=1 << 20, synced=False)
    yield e
    e.close()


@pytest.fixture
def frames(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path / "frames", map_size=1 << 20, names=FRAME_DBS, synced=False)
    yield e
    e.close()


def _writer(env: Env, frames: Env) -> Writer:
    spawn = Runtime().thread
    syncer = Syncer(env.path.parent / "durable", [env, frames], env.path.parent / "journal", spawn)
    return Writer(env, frames, syncer, spawn)


def test_failing_op_does_not_spoil_its_batch(env: Env, frames: Env) -> None:
    writer = _writer(env, frames)
    db = env.db["counters"]
    started, gate = threading.Event(), threading.Event()

    def hold(w: WriteTxn) -> None:  # holds the thread so the rest batch up
        started.set()
        gate.wait(5)

    blocker = writer.submit(hold)
    assert started.wait(5)

    def put(key: bytes) -> object:
        return writer.submit(lambda w: w.catalog.put(key, b"v", db=db))

    def boom(w: WriteTxn) -> None:
        w.catalog.put(b"bad", b"v", db=db)
        w.frames.put(b"bad", b"v", db=frames.db["frames"])
        raise ValueError("no")

    ok1, bad, ok2 = put(b"a"), writer.submit(boom), put(b"b")
    gate.set()
    blocker.result()
    assert ok1.result()
    assert ok2.result()
    with pytest.raises(ValueError, match="no"):
        bad.result()
    with env.read() as txn:
        assert txn.get(b"a", db=db) is not None
        assert txn.get(b"b", db=db) is not None
        assert txn.get(b"bad", db=db) is None
    with frames.read() as txn:
        assert txn.get(b"bad", db=frames.db["frames"]) is None
    assert writer.stats.batches == 2  # the blocker, then the three together
    writer.close()


def test_a_lone_failing_op_writes_nothing_and_the_next_commits(env: Env, frames: Env) -> None:
    """A batch of one runs in the writer's transactions themselves (no nested pair): its
    failure must abort both, and tell a staged caller before the writer goes on."""
    writer = _writer(env, frames)
    db, fdb = env.db["counters"], frames.db["frames"]

    def boom(w: WriteTxn) -> None:
        w.catalog.put(b"bad", b"v", db=db)
        w.frames.put(b"bad", b"v", db=fdb)
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        writer.run(boom)
    with pytest.raises(ValueError, match="no"):
        writer.stage(boom)
    assert writer.run(
        lambda w: w.catalog.put(b"a", b"v", db=db) and w.frames.put(b"a", b"v", db=fdb)
    )
    with env.read() as txn:
        assert txn.get(b"bad", db=db) is None
        assert txn.get(b"a", db=db) is not None
    with frames.read() as txn:
        assert txn.get(b"bad", db=fdb) is None
        assert txn.get(b"a", db=fdb) is not None
    assert writer.stats.batches == 3
    writer.close()


def test_map_grows_while_readers_run(env: Env, frames: Env) -> None:
    writer = _writer(env, frames)
    db = frames.db["frames"]
    stop = threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:
        while not stop.wait(0.001):  # pace the readers; a tight loop only measures the GIL
            try:
                with frames.read() as txn:
                    for _ in txn.cursor(db=db):
                        pass
            except BaseException as e:  # noqa: BLE001 - reported by the assertion below
                errors.append(e)
                return

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    values = {i.to_bytes(4, "big"): os.urandom(50_000) for i in range(200)}  # 10 MB > 1 MiB map
    for key, value in values.items():
        writer.submit(lambda w, k=key, v=value: w.frames.put(k, v, db=db), size=len(value))
    writer.run(lambda w: None)
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    assert writer.stats.map_growths >= 3
    with frames.read() as txn:
        assert all(bytes(txn.get(k, db=db)) == v for k, v in values.items())
    writer.close()


def test_a_data_dir_opens_in_one_process_only(tmp_path: Path) -> None:
    first = Env(tmp_path / "db")
    with pytest.raises(VaultError, match="in use"):
        Env(tmp_path / "db")
    first.close()
    Env(tmp_path / "db").close()
