"""Commit, one-request save and fork make checkpoints through one `create`: same rules."""

from __future__ import annotations

import json
import math
import struct

import pytest

from checkpoint_vault.protocol import CommitFile
from checkpoint_vault.vault import CheckpointNotFound, Conflict, FakeClock, MissingChunks, Vault

from .helpers import read_file, stream_save


def test_a_deleted_parent_is_not_found_whichever_way_the_checkpoint_is_made(
    vault: Vault,
) -> None:
    gone = stream_save(vault, "ns", {"a": b"a" * 5000})
    vault.lifecycle.delete("ns", gone.id)
    with pytest.raises(CheckpointNotFound):
        vault.open_upload("ns", parent=gone.id)
    with pytest.raises(CheckpointNotFound):
        vault.save("ns", {"b": b"b"}, parent=gone.id)
    with pytest.raises(CheckpointNotFound):
        vault.lifecycle.fork("ns", gone.id, "other")


def test_inheriting_from_a_parent_deleted_after_the_upload_opened_is_a_conflict(
    vault: Vault,
) -> None:
    parent = stream_save(vault, "ns", {"a": b"a" * 5000})
    session, _ = vault.open_upload("ns", parent=parent.id, inherit=True)
    vault.lifecycle.delete("ns", parent.id)
    with pytest.raises(Conflict):
        vault.committer.commit(session.id)
    assert vault.checkpoints("ns") == ([], None)  # nothing became visible


def test_one_request_save_inherits_like_a_commit(vault: Vault) -> None:
    base = vault.save("ns", {"model": b"m" * 9000, "opt": b"o" * 3000})[0]
    child = vault.save("ns", {"opt": b"p" * 3000}, parent=base.id, inherit=True)[0]
    assert sorted(child.files) == ["model", "opt"]
    assert read_file(vault, "ns", child.id, "model") == b"m" * 9000
    assert read_file(vault, "ns", child.id, "opt") == b"p" * 3000


def test_commit_refuses_chunks_collected_since_they_were_listed(
    vault: Vault, clock: FakeClock
) -> None:
    rec = stream_save(vault, "ns", {"a": b"x" * 40_000})
    entry = vault.manifest("ns", rec.id)[1]["a"]
    vault.lifecycle.delete("ns", rec.id)
    clock.advance(vault.config.upload_ttl + vault.config.gc_grace + 1)
    assert vault.gc().chunks_deleted > 0
    session, _ = vault.open_upload("ns")
    files = {"a": CommitFile(entry.size, entry.hash.hex(), [c.hex() for c, _ in entry.chunks])}
    with pytest.raises(MissingChunks):
        vault.committer.commit(session.id, files)


def test_idempotency_keys_replay_then_expire_with_gc(vault: Vault, clock: FakeClock) -> None:
    key = "k" * 20
    first, created = vault.save("ns", {"s": b"state"}, key=key)
    again, created_again = vault.save("ns", {"s": b"other state"}, key=key)
    assert (created, created_again) == (True, False)
    assert again.id == first.id
    with pytest.raises(Conflict):
        vault.save("elsewhere", {"s": b"state"}, key=key)
    assert vault.observe().upload_sessions == 0  # keys are not sessions
    clock.advance(vault.config.upload_ttl + 1)
    assert vault.gc().keys_expired == 1
    third, created_third = vault.save("ns", {"s": b"state"}, key=key)
    assert created_third
    assert third.id != first.id


def test_idempotency_keys_stored_by_older_versions_replay_and_expire(
    vault: Vault, clock: FakeClock
) -> None:
    """Older versions kept the key itself -> JSON {namespace, checkpoint, expires_at}."""
    first, _ = vault.save("ns", {"s": b"state"})
    key = "o" * 20
    old = json.dumps(
        {"namespace": "ns", "checkpoint": first.id, "expires_at": clock.now() + 10}
    ).encode()
    s = vault.store
    s.writer.run(lambda w: w.catalog.put(key.encode(), old, db=s.catalog_env.db["idempotency"]))
    again, created = vault.save("ns", {"s": b"other"}, key=key)
    assert (again.id, created) == (first.id, False)
    with pytest.raises(Conflict):
        vault.save("elsewhere", {"s": b"state"}, key=key)
    clock.advance(11)
    assert vault.gc().keys_expired == 1


def test_a_compact_key_whose_expiry_starts_like_json_expires(
    vault: Vault, clock: FakeClock
) -> None:
    """A compact entry starts with its f64 expiry's lowest byte: "{" for 1 key in 256."""
    ttl = vault.config.upload_ttl
    for _ in range(1024):  # one ulp at a time: the lowest byte takes every value
        if struct.pack("<d", clock.now() + ttl)[0] == ord("{"):
            break
        clock.t += math.ulp(clock.t)
    assert struct.pack("<d", clock.now() + ttl)[0] == ord("{")
    vault.save("ns", {"s": b"state"}, key="j" * 20)
    clock.advance(ttl + 1)
    assert vault.gc().keys_expired == 1


def test_a_parent_named_by_id_is_found_in_the_index_without_its_record(
    vault: Vault, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer resolves a save's parent inside its transaction, where each record
    decoded is time every save waits: an id of the namespace is looked up in its index
    (whose values are empty), the record is read only for `latest` or an id not there."""
    parent, _ = vault.save("ns", {"f": b"one"})
    other, _ = vault.save("other", {"f": b"two"})
    catalog = vault.store.catalog
    with vault.store.catalog_env.read() as txn:
        monkeypatch.setattr(type(catalog), "record", lambda *a: pytest.fail("record decoded"))
        assert catalog.resolve_id(txn, "ns", parent.id) == parent.id
        monkeypatch.undo()
        with pytest.raises(CheckpointNotFound):
            catalog.resolve_id(txn, "ns", other.id)
        assert catalog.resolve_id(txn, "ns", "latest") == parent.id
