"""File entries stored once and as deltas (vault/entries.py), and manifests of the older
form (whole entries, chunk references per checkpoint) still read, deleted and checked."""

from __future__ import annotations

import json

import pytest

from checkpoint_vault.protocol import Drift
from checkpoint_vault.vault import FakeClock, Vault, entries
from checkpoint_vault.vault.entries import COPY, MAX_DEPTH, OWN, Body, diff, entry_digest
from checkpoint_vault.vault.manifest import FileEntry, distinct_chunks, encode_manifest
from checkpoint_vault.vault.writer import WriteTxn

from .helpers import read_file


def _history(n: int) -> bytes:
    """A message list as an agent re-serializes it: grows at its end."""
    msgs = [{"role": "user", "content": f"message {i}: " + "lorem ipsum " * 40} for i in range(n)]
    return json.dumps(msgs).encode()


def _stored_entry_bytes(vault: Vault) -> int:
    return sum(len(v) for _, v in vault.store.catalog_env.scan("entries"))


def test_a_growing_file_is_stored_as_deltas_and_every_version_reads_back(vault: Vault) -> None:
    parent = None
    saved = []
    for step in range(MAX_DEPTH + 8):  # past one chain: some versions are stored whole
        data = _history(300 + step)
        rec, _ = vault.save("a/t", {"h": data, "k": b"same"}, parent=parent, chunking="small")
        saved.append((rec.id, data))
        parent = rec.id
    for cid, data in saved:
        assert read_file(vault, "a/t", cid, "h") == data
        assert read_file(vault, "a/t", cid, "k") == b"same"
    _, files = vault.manifest("a/t", "latest")
    whole = len(files["h"].to_bytes()) * len(saved)
    assert _stored_entry_bytes(vault) < whole / 3
    assert vault.check().ok


def test_deleting_bases_keeps_their_descendants_whole_then_gc_frees_them(
    vault: Vault, clock: FakeClock
) -> None:
    parent = None
    ids = []
    for step in range(10):
        rec, _ = vault.save("a/t", {"h": _history(20 + step)}, parent=parent, chunking="small")
        ids.append(rec.id)
        parent = rec.id
    for cid in ids[:-1]:  # every base of the last version's chain
        vault.lifecycle.delete("a/t", cid)
    assert read_file(vault, "a/t", ids[-1], "h") == _history(29)
    assert vault.check().ok
    vault.lifecycle.delete("a/t", ids[-1])
    report = vault.check()
    assert report.ok
    assert report.checkpoints == 0
    assert not list(vault.store.catalog_env.scan("entries"))
    clock.advance(3600 * 24)
    assert vault.gc().chunks_deleted == report.chunks


def test_retention_counts_bytes_freed_through_delta_chains(vault: Vault, clock: FakeClock) -> None:
    """A live delta keeps its bases (and the chunks only they hold) until its chain ends:
    the versions of the first chain go once the newest is in the next one."""
    parent = None
    for step in range(MAX_DEPTH + 4):
        rec, _ = vault.save("a/t", {"h": _history(20 + step)}, parent=parent, chunking="small")
        parent = rec.id
    vault.set_policy("a/t", {"retention": {"keep_last": 1}})
    plan = vault.retention(dry_run=True, namespace="a/t")
    reclaimable = plan.reclaimable_bytes
    assert reclaimable > 0
    vault.retention(dry_run=False, namespace="a/t")
    assert read_file(vault, "a/t", "latest", "h") == _history(20 + MAX_DEPTH + 3)
    assert vault.check().ok
    clock.advance(3600 * 24)
    assert vault.gc().bytes_freed == reclaimable


def _save_in_the_old_form(vault: Vault, ns: str, data: bytes, parent: str | None) -> str:
    """What a catalog written before entries holds: the manifest with its entries whole and
    one chunk reference per checkpoint (the old `Catalog.add`), made by hand."""
    rec, _ = vault.save(ns, {"h": data}, parent=parent, chunking="small")
    s = vault.store

    def op(w: WriteTxn) -> None:
        files = s.catalog.manifest(w.catalog, rec.id)
        digests = [entry_digest(e) for e in files.values()]
        for d in digests:  # undo the new form's references...
            s.catalog.entries.drop(w.catalog, d, s.now_ms())
        w.catalog.put(rec.id.encode(), encode_manifest(files), db=s.catalog_env.db["manifests"])
        s.chunks.add_refs(w.catalog, distinct_chunks(files), +1, s.now_ms())  # ...old ones

    s.writer.run(op)
    return rec.id


def test_manifests_of_the_older_form_read_delete_and_check(vault: Vault, clock: FakeClock) -> None:
    old = _save_in_the_old_form(vault, "a/t", _history(30), None)
    old2 = _save_in_the_old_form(vault, "a/t", _history(31), old)
    assert vault.check().ok
    new, _ = vault.save("a/t", {"h": _history(32)}, parent=old2, chunking="small", inherit=True)
    forked = vault.lifecycle.fork("a/t", old, "b/t")
    assert read_file(vault, "a/t", old, "h") == _history(30)
    assert read_file(vault, "b/t", forked.id, "h") == _history(30)
    assert vault.check().ok
    vault.set_policy("a/t", {"retention": {"keep_last": 1}})
    plan = vault.retention(dry_run=True, namespace="a/t")
    reclaimable = plan.reclaimable_bytes
    vault.retention(dry_run=False, namespace="a/t")
    clock.advance(3600 * 24)
    assert vault.gc().bytes_freed == reclaimable
    assert read_file(vault, "a/t", new.id, "h") == _history(32)
    assert read_file(vault, "b/t", forked.id, "h") == _history(30)
    assert vault.check().ok


def test_check_repairs_entry_counts(vault: Vault) -> None:
    rec, _ = vault.save("a/t", {"h": _history(25)}, chunking="small")
    s = vault.store
    _, files = vault.manifest("a/t", rec.id)
    digest = entry_digest(files["h"])
    s.writer.run(lambda w: s.catalog.entries.set_refs(w.catalog, digest, 5, s.now_ms()))
    report = vault.check()
    assert Drift(refs=5, expected=1, entry=digest.hex()) in report.drift
    assert vault.check(repair=True).repaired >= 1
    assert vault.check().ok
    assert read_file(vault, "a/t", rec.id, "h") == _history(25)


def test_identical_files_share_one_entry(vault: Vault) -> None:
    a, _ = vault.save("a/t", {"x": b"abc" * 1000, "y": b"abc" * 1000}, chunking="small")
    _, files = vault.manifest("a/t", a.id)
    assert (
        files["x"] == files["y"] == FileEntry(files["x"].size, files["x"].hash, files["x"].chunks)
    )
    assert len(list(vault.store.catalog_env.scan("entries"))) == 1
    vault.lifecycle.delete("a/t", a.id)
    assert vault.check().ok


def test_a_list_whose_head_changes_too_is_still_a_delta(vault: Vault) -> None:
    """msgpack (LangGraph's serializer) writes a list's length first: every version of a
    grown message list differs in its first chunk as well as its last."""
    parent = None
    saved = []
    for step in range(12):
        body = _history(100 + step)
        data = len(body).to_bytes(8, "little") + body
        rec, _ = vault.save("a/t", {"h": data}, parent=parent, chunking="small")
        saved.append((rec.id, data))
        parent = rec.id
    bodies = [Body.from_bytes(v) for _, v in vault.store.catalog_env.scan("entries")]
    assert sum(b.base is not None for b in bodies) == len(saved) - 1
    for cid, data in saved:
        assert read_file(vault, "a/t", cid, "h") == data
    assert vault.check().ok


def test_diff_copies_runs_and_keeps_its_own_chunks() -> None:
    c = [(bytes([i]) * 32, 10 + i) for i in range(8)]
    runs, own = diff((c[7], c[1], c[2], c[3], c[6]), (c[0], c[1], c[2], c[3], c[4]))
    assert runs == [(OWN, 0, 1), (COPY, 1, 3), (OWN, 0, 1)]
    assert own == (c[7], c[6])
    body = Body(0, b"", own, b"b" * 32, tuple(runs), 1)
    assert Body.from_bytes(body.to_bytes()).resolve((c[0], c[1], c[2], c[3], c[4])) == (
        c[7],
        c[1],
        c[2],
        c[3],
        c[6],
    )


def test_the_entry_cache_is_bounded_by_chunks(
    vault: Vault, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(entries, "CACHE_CHUNKS", 20)
    saved = []
    for i in range(6):
        data = bytes([i]) * 5 + _history(8 + i)
        rec, _ = vault.save("a/c", {"h": data}, chunking="small")
        saved.append((rec.id, data))
    for cid, data in saved:
        assert read_file(vault, "a/c", cid, "h") == data
    cache = vault.store.catalog.entries._cache
    assert 0 < sum(len(e.chunks) for e in cache.values()) <= 20


def test_a_chain_ends_before_deleted_versions_pin_much(
    vault: Vault, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each version changes ~6 KB in the middle (~10 KB of new chunks): with a 25 KB cap a
    chain holds two deltas, then a whole entry starts the next."""
    monkeypatch.setattr(entries, "MAX_CHAIN_BYTES", 25_000)
    base = bytearray(_history(60))
    parent = None
    for step in range(6):
        base[20_000:26_000] = bytes([step]) * 6_000
        rec, _ = vault.save("a/d", {"h": bytes(base)}, parent=parent, chunking="small")
        parent = rec.id
        assert read_file(vault, "a/d", rec.id, "h") == bytes(base)
    bodies = [Body.from_bytes(v) for _, v in vault.store.catalog_env.scan("entries")]
    assert all(b.chain_bytes <= 25_000 for b in bodies)
    assert sum(b.base is None for b in bodies) >= 2
    assert sum(b.base is not None for b in bodies) >= 2
    assert vault.check().ok
