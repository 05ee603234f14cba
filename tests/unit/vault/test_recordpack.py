"""Records are stored packed (vault/recordpack.py); plain JSON records of older catalogs
still read, and a catalog mixing both lists, patches and deletes alike."""

from __future__ import annotations

from checkpoint_vault.vault import Vault, recordpack


def test_pack_round_trips_and_shrinks_a_record() -> None:
    raw = (
        b'{"id":"01M83YVP0GHJPJYSCXRHQSW7D6","namespace":"a/b","parent":null,'
        b'"created_at":1.5,"metadata":{"step":3},"tags":[],"files":{},"size":0,'
        b'"pinned":false,"validity":{"state":"unverified","reason":null,"source":null,'
        b'"at":null,"previous":null},"tier":"hot","deleted_at":null,"promoted_at":null}'
    )
    packed = recordpack.pack(raw)
    assert recordpack.unpack(packed) == raw
    assert len(packed) < len(raw) / 2
    assert recordpack.unpack(raw) == raw  # the older, plain form


def test_records_stored_plain_by_older_versions_still_read_and_change(vault: Vault) -> None:
    old, _ = vault.save("a/b", {"f": b"one"}, metadata={"n": 1})
    new, _ = vault.save("a/b", {"f": b"two"}, metadata={"n": 2}, parent=old.id)
    s = vault.store
    db = s.catalog_env.db["checkpoints"]
    s.writer.run(lambda w: w.catalog.put(old.id.encode(), old.to_json(), db=db))
    with s.catalog_env.read() as txn:
        stored = txn.get(old.id.encode(), db=db)
        assert stored is not None
        assert bytes(stored)[:1] == b"{"
    listed, _ = vault.checkpoints("a/b")
    assert [(r.id, r.metadata) for r in listed] == [(new.id, {"n": 2}), (old.id, {"n": 1})]
    assert vault.lifecycle.patch("a/b", old.id, tags=["kept"]).tags == ["kept"]
    assert vault.get("a/b", old.id).tags == ["kept"]
    vault.lifecycle.delete("a/b", old.id)
    assert [r.id for r in vault.lineage("a/b", new.id)] == [new.id, old.id]
    assert vault.check().ok
