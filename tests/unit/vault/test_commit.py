from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from checkpoint_vault.protocol import CommitFile
from checkpoint_vault.vault import (
    CheckpointNotFound,
    Conflict,
    HashMismatch,
    InvalidRequest,
    MissingChunks,
    TooManyUploads,
    UploadExpired,
    Vault,
    VaultConfig,
)
from checkpoint_vault.vault.clock import FakeClock
from checkpoint_vault.vault.frame import chunk_id
from checkpoint_vault.vault.writer import WriteTxn

from .helpers import client_save, read_file, stream_save


def test_streamed_and_client_chunked_files_read_back(vault: Vault) -> None:
    a, b = os.urandom(250_000), os.urandom(3_333)
    rec = stream_save(vault, "ns", {"a.bin": a})
    rec2 = client_save(vault, "ns", {"b.bin": b}, parent=rec.id)
    assert read_file(vault, "ns", rec.id, "a.bin") == a
    assert read_file(vault, "ns", rec2.id, "b.bin") == b
    assert rec2.parent == rec.id
    assert "a.bin" not in rec2.files


def test_commit_is_idempotent(vault: Vault) -> None:
    session, _ = vault.open_upload("ns")
    first, created = vault.committer.commit(session.id)
    again, created_again = vault.committer.commit(session.id)
    assert created
    assert not created_again
    assert first.id == again.id
    assert vault.stats().checkpoints == 1


def test_nothing_is_visible_before_commit_or_after_abort(vault: Vault) -> None:
    session, _ = vault.open_upload("ns")
    ingest = vault.ingest(session.id, "x")
    ingest.feed(b"data" * 1000, final=True)
    ingest.finish()
    assert vault.checkpoints("ns") == ([], None)
    vault.uploads.abort(session.id)
    assert vault.checkpoints("ns") == ([], None)
    with pytest.raises(CheckpointNotFound):
        vault.get("ns", "latest")


def test_inherit_takes_unsent_files_from_parent(vault: Vault) -> None:
    base = stream_save(vault, "ns", {"model": b"m" * 5000, "opt": b"o" * 7000})
    child = stream_save(vault, "ns", {"opt": b"p" * 7000}, parent="latest", inherit=True)
    assert sorted(child.files) == ["model", "opt"]
    assert read_file(vault, "ns", child.id, "model") == b"m" * 5000
    assert read_file(vault, "ns", child.id, "opt") == b"p" * 7000
    assert child.parent == base.id


def test_wrong_hash_size_or_missing_chunk_is_refused(vault: Vault) -> None:
    data = os.urandom(2000)
    session, _ = vault.open_upload("ns")
    cid = chunk_id(data).hex()
    vault.uploads.put_chunk(session.id, cid, data)
    good = CommitFile(size=2000, hash=cid, chunks=[cid])
    with pytest.raises(HashMismatch):
        vault.committer.commit(session.id, {"f": replace(good, hash="0" * 64)})
    with pytest.raises(InvalidRequest):
        vault.committer.commit(session.id, {"f": replace(good, size=1999)})
    with pytest.raises(MissingChunks) as err:
        vault.committer.commit(session.id, {"f": replace(good, chunks=[cid, "a" * 64])})
    assert err.value.chunks == ["a" * 64]
    assert vault.checkpoints("ns") == ([], None)
    record, _ = vault.committer.commit(session.id, {"f": good})
    assert read_file(vault, "ns", record.id, "f") == data


def test_a_commit_without_the_hash_gets_the_one_the_server_computes(vault: Vault) -> None:
    data = os.urandom(300_000)
    pieces = [data[:100_000], data[100_000:]]
    session, _ = vault.open_upload("ns")
    ids = [chunk_id(p).hex() for p in pieces]
    for cid, piece in zip(ids, pieces, strict=True):
        vault.uploads.put_chunk(session.id, cid, piece)
    first, _ = vault.committer.commit(session.id, {"f": CommitFile(len(data), None, ids)})
    assert first.files["f"]["hash"] == chunk_id(data).hex()
    # The same file again, neither hash given nor parent named: proven by the latest.
    again, _ = vault.open_upload("ns")
    second, _ = vault.committer.commit(
        again.id, {"f": CommitFile(len(data), None, ids), "g": CommitFile(0, None, [])}
    )
    assert second.files["f"]["hash"] == chunk_id(data).hex()
    assert second.files["g"]["hash"] == chunk_id(b"").hex()
    assert read_file(vault, "ns", second.id, "f") == data
    # A wrong hash for a proven file is still refused.
    third, _ = vault.open_upload("ns", parent=second.id)
    with pytest.raises(HashMismatch):
        vault.committer.commit(third.id, {"f": CommitFile(len(data), "0" * 64, ids)})


def test_expired_upload_cannot_commit(vault: Vault, clock: FakeClock) -> None:
    session, _ = vault.open_upload("ns")
    clock.advance(vault.config.upload_ttl + 1)
    with pytest.raises(UploadExpired):
        vault.committer.commit(session.id)
    with pytest.raises(UploadExpired):
        vault.uploads.missing(session.id, [])


def test_latest_valid_skips_invalid(vault: Vault) -> None:
    first = stream_save(vault, "ns", {"f": b"1"})
    second = stream_save(vault, "ns", {"f": b"2"})
    vault.lifecycle.patch("ns", second.id, validity={"state": "invalid", "reason": "NaN loss"})
    assert vault.get("ns", "latest").id == second.id
    assert vault.get("ns", "latest-valid").id == first.id
    vault.lifecycle.patch("ns", first.id, validity={"state": "invalid"})
    with pytest.raises(CheckpointNotFound):
        vault.get("ns", "latest-valid")


def test_lineage_keeps_tombstones(vault: Vault) -> None:
    a = stream_save(vault, "ns", {"f": b"a"})
    b = stream_save(vault, "ns", {"f": b"b"}, parent="latest")
    c = stream_save(vault, "ns", {"f": b"c"}, parent="latest")
    vault.lifecycle.delete("ns", b.id)
    chain = vault.lineage("ns", c.id)
    assert [r.id for r in chain] == [c.id, b.id, a.id]
    assert chain[1].is_tombstone
    assert not chain[0].is_tombstone
    with pytest.raises(CheckpointNotFound):
        vault.get("ns", b.id)


def test_pinned_checkpoint_cannot_be_deleted(vault: Vault) -> None:
    rec = stream_save(vault, "ns", {"f": b"x"})
    vault.lifecycle.patch("ns", rec.id, pinned=True)
    with pytest.raises(Conflict):
        vault.lifecycle.delete("ns", rec.id)
    vault.lifecycle.patch("ns", rec.id, pinned=False)
    vault.lifecycle.delete("ns", rec.id)


def test_listing_pages_newest_first_with_filters(vault: Vault) -> None:
    ids = [
        stream_save(vault, "ns", {"f": bytes([i])}, tags=["even"] if i % 2 == 0 else []).id
        for i in range(7)
    ]
    page, cursor = vault.checkpoints("ns", limit=3)
    assert [r.id for r in page] == ids[::-1][:3]
    page2, cursor2 = vault.checkpoints("ns", limit=3, before=cursor)
    assert [r.id for r in page2] == ids[::-1][3:6]
    page3, cursor3 = vault.checkpoints("ns", limit=3, before=cursor2)
    assert [r.id for r in page3] == ids[:1]
    assert cursor3 is None
    tagged, _ = vault.checkpoints("ns", tag="even")
    assert [r.id for r in tagged] == [ids[6], ids[4], ids[2], ids[0]]


def test_fork_shares_chunks_and_counts_references(vault: Vault) -> None:
    data = os.urandom(300_000)
    src = stream_save(vault, "a", {"f": data})
    stored = vault.stats().stored_bytes
    fork = vault.lifecycle.fork("a", src.id, "b/child", metadata={"why": "experiment"})
    assert vault.stats().stored_bytes == stored
    assert fork.parent == src.id
    assert fork.namespace == "b/child"
    vault.lifecycle.delete("a", src.id)
    assert read_file(vault, "b/child", fork.id, "f") == data
    assert vault.check().ok


def test_ids_keep_increasing_when_the_clock_steps_back_across_a_restart(
    tmp_path: Path,
) -> None:
    clock = FakeClock(2_000_000_000.0)
    first = Vault(tmp_path / "v", clock=clock)
    old = stream_save(first, "ns", {"f": b"1"})
    first.close()
    clock.advance(-3600)
    second = Vault(tmp_path / "v", clock=clock)
    new = stream_save(second, "ns", {"f": b"2"})
    assert new.id > old.id
    assert second.get("ns", "latest").id == new.id
    second.close()


def test_open_upload_sessions_are_limited(tmp_path: Path) -> None:
    clock = FakeClock()
    vault = Vault(tmp_path / "v", VaultConfig(max_upload_sessions=2), clock)
    first, _ = vault.open_upload("ns")
    second, _ = vault.open_upload("ns")
    with pytest.raises(TooManyUploads):
        vault.open_upload("ns")
    vault.save("ns", {"f": b"one-request saves do not count"})
    vault.committer.commit(first.id)
    third, _ = vault.open_upload("ns")
    vault.uploads.abort(second.id)
    vault.open_upload("ns")
    clock.advance(vault.config.upload_ttl + 1)
    vault.gc()
    vault.open_upload("ns")
    vault.open_upload("ns")
    assert third.id
    vault.close()


def test_tag_index_follows_retags_deletes_forks_and_old_catalogs(
    vault: Vault, tmp_path: Path, clock: FakeClock
) -> None:
    ids = [
        stream_save(vault, "ns", {"f": bytes([i])}, tags=[f"step:{i}", "all"]).id for i in range(5)
    ]
    assert [r.id for r in vault.checkpoints("ns", tag="step:3")[0]] == [ids[3]]
    assert [r.id for r in vault.checkpoints("ns", tag="all", before=ids[3])[0]] == ids[:3][::-1]
    vault.lifecycle.patch("ns", ids[3], tags=["moved"])
    assert vault.checkpoints("ns", tag="step:3")[0] == []
    assert [r.id for r in vault.checkpoints("ns", tag="moved")[0]] == [ids[3]]
    vault.lifecycle.delete("ns", ids[1])
    assert [r.id for r in vault.checkpoints("ns", tag="all")[0]] == [ids[4], ids[2], ids[0]]
    fork = vault.lifecycle.fork("ns", ids[0], "other", tags=["all"])
    assert [r.id for r in vault.checkpoints("other", tag="all")[0]] == [fork.id]
    assert vault.checkpoints("ns", tag="step:1\0x")[0] == []  # any tag string is safe

    # a catalog from before the index: entries and the marker gone, rebuilt at open
    db, counters = vault.store.catalog_env.db["tagindex"], vault.store.catalog_env.db["counters"]

    def forget_index(w: WriteTxn) -> None:
        w.catalog.drop(db, delete=False)
        w.catalog.delete(b"tag_index_built", db=counters)

    vault.store.writer.run(forget_index)
    assert vault.checkpoints("ns", tag="all")[0] == []
    vault.close()
    reopened = Vault(tmp_path / "vault", VaultConfig(map_size=1 << 20), clock)
    try:
        assert [r.id for r in reopened.checkpoints("ns", tag="all")[0]] == [ids[4], ids[2], ids[0]]
        assert [r.id for r in reopened.checkpoints("ns", tag="moved")[0]] == [ids[3]]
    finally:
        reopened.close()
