"""Shrinking the hot store: freed pages go back to the file system (`du` drops), and nothing
any reader can see, nor the durable state, is touched."""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

import lmdb
import numpy as np

from checkpoint_vault.vault import FakeClock, Vault, VaultConfig
from checkpoint_vault.vault.env import DATA_FILE
from checkpoint_vault.vault.pages import oldest_reader, read_free_list
from checkpoint_vault.vault.samples import allocated_bytes
from checkpoint_vault.vault.shrink import shrink

from .helpers import client_save, read_file

PIECE = 256 << 10


def blob(seed: int, size: int = 2 << 20) -> bytes:
    return np.random.default_rng(seed).bytes(size)


def frames_allocated(vault: Vault) -> int:
    return (vault.store.frames_env.path / DATA_FILE).stat().st_blocks * 512


def test_free_list_and_pages_in_use_cover_the_file(tmp_path: Path) -> None:
    """The free list read from the file is exactly the pages no tree uses: with the pages
    LMDB's own statistics count in use, they add up to the file, and none is a meta page."""
    env = lmdb.open(str(tmp_path), map_size=1 << 28, max_dbs=2)
    db = env.open_db(b"x")
    rng = random.Random(3)
    for _ in range(20):
        with env.begin(write=True) as txn:
            for _ in range(30):
                key = rng.randrange(1 << 30).to_bytes(8, "big")
                txn.put(key, rng.randbytes(rng.choice([50, 3000, 40_000, 300_000])), db=db)
        with env.begin(write=True) as txn:
            keys = [bytes(k) for k, _ in txn.cursor(db=db)]
            for key in rng.sample(keys, len(keys) // 2):
                txn.delete(key, db=db)
    fd = os.open(tmp_path / DATA_FILE, os.O_RDONLY)
    try:
        free = read_free_list(env, fd)
    finally:
        os.close(fd)
    pages = [p for ps in free.freed.values() for p in ps]
    assert len(pages) == len(set(pages)) > 100
    assert min(pages) >= 2
    assert max(pages) <= free.last_page
    with env.begin() as txn:
        stats = [txn.stat(db), env.stat()]
    used = sum(s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"] for s in stats)
    assert free.own_pages >= 2  # a leaf and an overflow page, at least, here
    assert free.last_page + 1 == 2 + used + free.own_pages + len(pages)  # 2: meta pages
    assert oldest_reader(env) == free.txnid  # nobody reads: the newest transaction
    env.close()


def test_shrink_gives_freed_frames_back_and_every_checkpoint_reads(tmp_path: Path) -> None:
    clock = FakeClock()
    vault = Vault(tmp_path / "v", VaultConfig(map_size=1 << 26, gc_grace=0.0), clock)
    try:
        files = [blob(i) for i in range(8)]
        ids = [client_save(vault, "ns", {"w.bin": f}, chunk_size=PIECE).id for f in files]
        for ckpt in ids[:-2]:
            vault.lifecycle.delete("ns", ckpt)
        clock.advance(7 * 3600.0)  # past the uploads' reservations
        vault.gc()
        before = frames_allocated(vault)
        stats = vault.stats()
        assert stats.environments is not None
        frames = stats.environments["frames"]
        assert frames.free_bytes >= 6 * (2 << 20)  # six deleted checkpoints' frames
        assert frames.reclaimable_bytes >= 6 * (2 << 20)
        assert stats.disk_bytes == allocated_bytes(vault.path)
        assert stats.reclaimable_bytes == sum(
            e.reclaimable_bytes for e in stats.environments.values()
        )
        done = vault.shrink()
        assert done is not None
        assert done.pages > 0
        after = frames_allocated(vault)
        assert before - after >= 6 * (2 << 20)
        assert done.freed >= before - after
        assert after < 2.2 * 2 * (2 << 20)  # two checkpoints' frames, and LMDB's pages
        again = vault.stats()
        assert again.environments is not None
        assert again.environments["frames"].reclaimable_bytes < (1 << 20)
        assert vault.shrink() is None  # nothing worth giving back now
        for ckpt, data in zip(ids[-2:], files[-2:], strict=True):
            assert read_file(vault, "ns", ckpt, "w.bin") == data
        # Writes after a shrink reuse the punched pages and read back; check finds nothing.
        more = [blob(100 + i) for i in range(3)]
        new = [client_save(vault, "ns", {"w.bin": f}, chunk_size=PIECE).id for f in more]
        assert vault.check().ok
    finally:
        vault.close()
    vault = Vault(tmp_path / "v", VaultConfig(map_size=1 << 26, gc_grace=0.0), clock)
    try:
        for ckpt, data in zip(ids[-2:] + new, files[-2:] + more, strict=True):
            assert read_file(vault, "ns", ckpt, "w.bin") == data
        assert vault.check().ok
    finally:
        vault.close()


def test_a_reader_keeps_the_pages_it_can_see(tmp_path: Path) -> None:
    """A read transaction open from before the delete (a download, or a worker process's
    read) keeps the frames it sees allocated and readable through a shrink."""
    clock = FakeClock()
    vault = Vault(tmp_path / "v", VaultConfig(map_size=1 << 26, gc_grace=0.0), clock)
    try:
        data = blob(7)
        ckpt = client_save(vault, "ns", {"w.bin": data}, chunk_size=PIECE).id
        client_save(vault, "ns", {"w.bin": blob(8)}, chunk_size=PIECE)
        _, files = vault.manifest("ns", ckpt)
        cids = [c for c, _ in files["w.bin"].chunks]
        with vault.store.frames_env.read() as txn:  # the snapshot from before the delete
            vault.lifecycle.delete("ns", ckpt)
            clock.advance(7 * 3600.0)  # past the uploads' reservations
            vault.gc()
            held = vault.shrink(above=0.0)
            assert held is None or held.freed < len(data) // 2
            seen = [
                bytes(txn.get(k, db=vault.store.frames_env.db["frames"]) or b"")
                for k in _frame_keys(vault, cids, txn)
            ]
            assert sum(len(f) for f in seen) >= len(data) // 2
            assert all(any(f) for f in seen)  # not holes: still the frames
        vault.store.writer.wait_durable()
        done = vault.shrink(above=0.0)
        assert done is not None
        assert done.freed >= len(data) // 2
        assert vault.check().ok
    finally:
        vault.close()


def _frame_keys(vault: Vault, cids: list[bytes], txn: lmdb.Transaction) -> list[bytes]:
    """The frame keys the deleted checkpoint's chunks had: the frames database's keys
    this old snapshot holds that the newest one no longer does."""
    db = vault.store.frames_env.db["frames"]
    old = {bytes(k) for k, _ in txn.cursor(db=db)}
    with vault.store.frames_env.read() as now:
        new = {bytes(k) for k, _ in now.cursor(db=db)}
    assert len(old - new) >= len(cids) // 2
    return sorted(old - new)


def test_reads_go_on_through_shrinks(tmp_path: Path) -> None:
    """A thread reading the live checkpoints (every chunk verified against its id) all the
    while checkpoints are saved, deleted, collected and the hot store shrunk: every read
    returns the bytes saved."""
    clock = FakeClock()
    vault = Vault(tmp_path / "v", VaultConfig(map_size=1 << 26, gc_grace=0.0), clock)
    keep = blob(50)
    kept = client_save(vault, "keep", {"w.bin": keep}, chunk_size=PIECE).id
    stop = threading.Event()
    reads: list[bool] = []

    def reader() -> None:
        while not stop.is_set():
            reads.append(read_file(vault, "keep", kept, "w.bin") == keep)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        shrunk = 0
        for i in range(6):
            old = client_save(vault, "ns", {"w.bin": blob(60 + i)}, chunk_size=PIECE).id
            vault.lifecycle.delete("ns", old)
            clock.advance(7 * 3600.0)
            vault.gc()
            done = vault.shrink(above=0.0)
            shrunk += done is not None and done.pages > 0
    finally:
        stop.set()
        thread.join()
        vault.close()
    assert shrunk >= 5
    assert len(reads) >= 6
    assert all(reads)


def test_a_large_shrink_goes_in_slices(tmp_path: Path) -> None:
    """Given back at most `slice_bytes` per pause of the writer, each slice reading the free
    list again; the slices together give back what one would, and pages punched before
    are not counted again."""
    clock = FakeClock()
    vault = Vault(tmp_path / "v", VaultConfig(map_size=1 << 26, gc_grace=0.0), clock)
    try:
        ids = [client_save(vault, "ns", {"w.bin": blob(i)}, chunk_size=PIECE).id for i in range(6)]
        for ckpt in ids[:-1]:
            vault.lifecycle.delete("ns", ckpt)
        clock.advance(7 * 3600.0)
        vault.gc()
        done = shrink(vault.store, slice_bytes=1 << 20)
        assert done.slices >= 10  # 10 MiB of frames, 1 MiB a slice
        assert done.freed >= 5 * (2 << 20)
        assert done.pages * 4096 >= 5 * (2 << 20)
        again = shrink(vault.store, slice_bytes=1 << 20)
        assert again.pages == 0  # all holes already
        assert again.slices == 1
        assert read_file(vault, "ns", ids[-1], "w.bin") == blob(5)
        assert vault.check().ok
    finally:
        vault.close()
