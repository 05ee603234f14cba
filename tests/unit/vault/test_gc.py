from __future__ import annotations

import os
import random

import pytest

from checkpoint_vault.protocol import CommitFile, Drift
from checkpoint_vault.vault import ChunkCorrupt, MissingChunks, Vault
from checkpoint_vault.vault.clock import FakeClock
from checkpoint_vault.vault.content.chunks import seq_key
from checkpoint_vault.vault.content.location import Inline
from checkpoint_vault.vault.frame import chunk_id
from checkpoint_vault.vault.writer import WriteTxn

from .helpers import client_save, flip_last_byte, read_file, stream_save


def test_dedup_stores_repeated_chunks_once(vault: Vault) -> None:
    data = random.Random(8).randbytes(2_000_000)
    stream_save(vault, "ns", {"f": data})
    before = vault.stats()
    edited = data[:1_000_000] + b"x" * 1000 + data[1_001_000:]
    stream_save(vault, "ns", {"f": edited})
    after = vault.stats()
    assert after.chunks - before.chunks <= 3
    assert after.stored_bytes - before.stored_bytes < 300_000


def test_gc_waits_for_grace_and_expiry(vault: Vault, clock: FakeClock) -> None:
    rec = stream_save(vault, "ns", {"f": os.urandom(200_000)})
    vault.lifecycle.delete("ns", rec.id)
    assert vault.gc().chunks_deleted == 0  # upload reservation and grace still running
    clock.advance(vault.config.upload_ttl + 1)
    report = vault.gc()
    assert report.chunks_deleted > 0
    assert report.uploads_expired == 1
    assert vault.stats().chunks == 0
    assert vault.stats().stored_bytes == 0
    assert vault.check().ok


def test_gc_never_takes_a_chunk_a_live_upload_was_told_exists(
    vault: Vault, clock: FakeClock
) -> None:
    data = os.urandom(5000)
    old = client_save(vault, "ns", {"f": data})
    vault.lifecycle.delete("ns", old.id)
    clock.advance(vault.config.upload_ttl + vault.config.gc_grace + 1)
    session, _ = vault.open_upload("ns")
    ids = [chunk_id(data[i : i + 1000]).hex() for i in range(0, 5000, 1000)]
    assert vault.uploads.missing(session.id, ids) == []  # present, so reserved for this session
    clock.advance(vault.config.gc_grace + 1)
    assert vault.gc().chunks_deleted == 0
    listing = {"f": CommitFile(5000, chunk_id(data).hex(), ids)}
    rec, _ = vault.committer.commit(session.id, listing)
    assert read_file(vault, "ns", rec.id, "f") == data


def test_commit_after_chunks_were_collected_reports_them_missing(
    vault: Vault, clock: FakeClock
) -> None:
    data = os.urandom(3000)
    session, _ = vault.open_upload("ns")
    ids = [chunk_id(data[i : i + 1000]).hex() for i in range(0, 3000, 1000)]
    for i, cid in enumerate(ids):
        vault.uploads.put_chunk(session.id, cid, data[i * 1000 : (i + 1) * 1000])
    vault.uploads.abort(session.id)
    clock.advance(vault.config.upload_ttl + 1)
    assert vault.gc().chunks_deleted == 3
    later, _ = vault.open_upload("ns")
    with pytest.raises(MissingChunks) as err:
        vault.committer.commit(later.id, {"f": CommitFile(3000, chunk_id(data).hex(), ids)})
    assert sorted(err.value.chunks) == sorted(ids)


def test_check_reports_and_repairs_drift(vault: Vault) -> None:
    rec = stream_save(vault, "ns", {"f": os.urandom(100_000)})
    assert vault.check().ok
    _, files = vault.manifest("ns", rec.id)
    victim = files["f"].chunks[0][0]

    def corrupt_count(w: WriteTxn) -> None:
        meta = vault.store.chunks.meta(w.catalog, victim)
        assert meta is not None
        vault.store.chunks.set_meta(w.catalog, victim, meta._replace(refs=5))

    vault.store.writer.run(corrupt_count)
    report = vault.check()
    assert not report.ok
    assert report.drift == [Drift(refs=5, expected=1, chunk=victim.hex())]
    assert vault.check(repair=True).repaired == 1
    assert vault.check().ok


def test_damaged_chunk_is_reported_missing_and_healed_by_upload(vault: Vault) -> None:
    data = os.urandom(4000)
    rec = client_save(vault, "ns", {"f": data})
    victim = data[:1000]
    vid = chunk_id(victim)

    flip_last_byte(vault, vid)
    with pytest.raises(ChunkCorrupt):
        read_file(vault, "ns", rec.id, "f")
    vault.store.writer.run(lambda txn: None)  # the damage flag is written by then
    assert not vault.check().ok
    session, _ = vault.open_upload("ns")
    assert vault.uploads.missing(session.id, [vid.hex()]) == [vid.hex()]
    assert vault.uploads.put_chunk(session.id, vid.hex(), victim) is True
    assert read_file(vault, "ns", rec.id, "f") == data
    assert vault.check().ok


def test_frames_left_by_a_crash_between_commits_are_found_and_dropped(vault: Vault) -> None:
    """The writer commits frames before the catalog; a crash in between leaves frames that
    no chunk names. check counts them, repair drops them, and nothing else changes."""
    data = os.urandom(50_000)
    rec = stream_save(vault, "ns", {"f": data})
    frames_db = vault.store.frames_env.db["frames"]
    vault.store.writer.run(lambda w: w.frames.put(seq_key(10**9), b"stray", db=frames_db))
    report = vault.check()
    assert report.ok
    assert report.orphan_frames == 1
    assert vault.check(repair=True).repaired == 1
    assert vault.check().orphan_frames == 0
    assert read_file(vault, "ns", rec.id, "f") == data


def test_one_request_saves_store_inline_and_gc_collects_them(
    vault: Vault, clock: FakeClock
) -> None:
    state = os.urandom(30_000)
    rec, created = vault.save("agent", {"state.json": state}, chunking="small")
    assert created
    assert read_file(vault, "agent", rec.id, "state.json") == state
    with vault.store.catalog_env.read() as txn:
        assert sum(1 for _ in txn.cursor(db=vault.store.catalog_env.db["inline_frames"])) > 0
    with vault.store.frames_env.read() as txn:
        assert sum(1 for _ in txn.cursor(db=vault.store.frames_env.db["frames"])) == 0
    assert vault.check().ok
    vault.lifecycle.delete("agent", rec.id)
    clock.advance(vault.config.gc_grace + 1)
    assert vault.gc().chunks_deleted > 0
    with vault.store.catalog_env.read() as txn:
        assert sum(1 for _ in txn.cursor(db=vault.store.catalog_env.db["inline_frames"])) == 0
    assert vault.check().ok
    assert vault.stats().stored_bytes == 0


def test_inline_frames_are_appended_so_their_pages_fill(vault: Vault) -> None:
    """Keyed by the random chunk id the inline table's pages were ~60% full (LMDB splits a
    full page in half unless the key goes at the very end); numbered, every key does."""
    rng = random.Random(5)
    for i in range(300):
        vault.save("agent", {"s.json": rng.randbytes(300 + i % 200)}, chunking="small")
    db = vault.store.catalog_env.db["inline_frames"]
    with vault.store.catalog_env.read() as txn:
        keys = [bytes(k) for k, _ in txn.cursor(db=db)]
        used = sum(len(k) + len(v) for k, v in txn.cursor(db=db))
        stat = txn.stat(db)
    assert len(keys) >= 300
    assert keys == sorted(keys)
    assert used / (stat["leaf_pages"] * stat["psize"]) > 0.85


def test_an_inline_chunk_keyed_by_its_id_still_reads_and_goes(
    vault: Vault, clock: FakeClock
) -> None:
    """Catalogs written before inline frames had numbers keep them keyed by the chunk id
    (sequence 0): read, checked and collected like the numbered ones."""
    state = os.urandom(200)
    rec, _ = vault.save("agent", {"state.json": state}, chunking="small")
    chunks, env = vault.store.chunks, vault.store.catalog_env
    with env.read() as txn:
        ((cid, _),) = chunks.all(txn)  # the state is one chunk

    def unnumber(w: WriteTxn) -> None:
        meta = chunks.meta(w.catalog, cid)
        assert meta is not None
        assert isinstance(meta.where, Inline)
        assert meta.where.seq
        frame = w.catalog.get(seq_key(meta.where.seq), db=env.db["inline_frames"])
        assert frame is not None
        w.catalog.delete(seq_key(meta.where.seq), db=env.db["inline_frames"])
        w.catalog.put(cid, bytes(frame), db=env.db["inline"])
        chunks.set_meta(w.catalog, cid, meta._replace(where=Inline(0)))

    vault.store.writer.run(unnumber)
    with env.read() as txn:
        assert chunks.meta(txn, cid).where == Inline(0)  # type: ignore[union-attr]
    assert read_file(vault, "agent", rec.id, "state.json") == state
    assert vault.check().ok
    vault.lifecycle.delete("agent", rec.id)
    clock.advance(vault.config.gc_grace + 1)
    assert vault.gc().chunks_deleted == 1
    with env.read() as txn:
        assert txn.get(cid, db=env.db["inline"]) is None
    assert vault.check().ok


def test_repair_drops_unreserved_orphans_but_not_reserved_ones(
    vault: Vault, clock: FakeClock
) -> None:
    data = random.Random(12).randbytes(3000)
    ids = [chunk_id(data[i : i + 1000]).hex() for i in range(0, 3000, 1000)]
    session, _ = vault.open_upload("ns")
    for i, cid in enumerate(ids):
        vault.uploads.put_chunk(session.id, cid, data[i * 1000 : (i + 1) * 1000])
    assert len(vault.check().orphans) == 3
    assert vault.check(repair=True).repaired == 0  # the live upload reserved them
    vault.uploads.abort(session.id)
    clock.advance(vault.config.upload_ttl + 1)
    assert vault.check(repair=True).repaired == 3
    assert vault.stats().chunks == 0


def test_gc_stops_before_its_next_batch_when_the_server_stops(
    vault: Vault, clock: FakeClock
) -> None:
    """SIGTERM sets `stop`: a GC raises `MaintenanceStopped` before deleting more, keeps
    what it committed, and the next run collects the rest."""
    import threading

    from checkpoint_vault.vault import MaintenanceStopped

    rec = stream_save(vault, "ns", {"f": os.urandom(200_000)})
    vault.lifecycle.delete("ns", rec.id)
    clock.advance(vault.config.upload_ttl + 1)
    chunks = vault.stats().chunks
    stop = threading.Event()
    stop.set()
    with pytest.raises(MaintenanceStopped):
        vault.gc(stop=stop)
    assert vault.stats().chunks == chunks  # nothing deleted past the stop
    assert vault.gc().chunks_deleted == chunks
    assert vault.check().ok


def test_check_stops_mid_scan_and_repairs_nothing(
    vault: Vault, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM during `check --repair`: the recount stops between manifests and nothing
    is repaired; the next check repairs what drifted."""
    from checkpoint_vault.vault import MaintenanceStopped, catalog

    from .helpers import StopAfter

    monkeypatch.setattr(catalog, "RECOUNT_STEP", 1)  # a look at `stop` per manifest
    recs = [stream_save(vault, "ns", {"f": os.urandom(5000)}) for _ in range(4)]
    _, files = vault.manifest("ns", recs[0].id)
    cid = files["f"].chunks[0][0]
    vault.store.writer.run(
        lambda w: vault.store.chunks.set_meta(
            w.catalog, cid, vault.store.chunks.meta(w.catalog, cid)._replace(refs=7)
        )
    )
    with pytest.raises(MaintenanceStopped):
        vault.check(repair=True, stop=StopAfter(2))
    assert len(vault.check().drift) == 1  # nothing repaired
    assert vault.check(repair=True).repaired == 1
    assert vault.check().ok
