"""vault/txn.py on the engine: prepare, apply, abort and the `prepared` index, and a
prepared upload carried by the replica (what a takeover's promotion reads)."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpoint_vault.protocol import CommitFile
from checkpoint_vault.tiering.backends.local import LocalTier
from checkpoint_vault.vault import Conflict, Vault
from checkpoint_vault.vault.errors import MissingChunks, NotFound, UploadPrepared
from checkpoint_vault.vault.replication import ReplicationConfig, restore_replica
from checkpoint_vault.vault.txn import Entry, Transactions

from ..replication.test_replica import _wait_caught_up
from .helpers import read_file

TXN = "ab" * 16


def _txns(vault: Vault) -> Transactions:
    return Transactions(vault.store, vault.uploads, vault.committer)


def _upload(vault: Vault, ns: str, data: bytes) -> str:
    """An upload of `ns` holding file `f`, streamed, not committed."""
    session, _ = vault.open_upload(ns)
    ingest = vault.ingest(session.id, "f")
    ingest.feed(data, final=True)
    ingest.finish()
    return session.id


def _latest(vault: Vault, ns: str) -> str | None:
    try:
        return vault.get(ns, "latest").id
    except NotFound:
        return None


def test_prepare_holds_the_upload_and_apply_or_abort_ends_it(vault: Vault) -> None:
    txns = _txns(vault)
    a, b = _upload(vault, "a", b"a" * 5000), _upload(vault, "b", b"b" * 5000)
    txns.prepare(TXN, Entry("a", a))
    txns.prepare(TXN, Entry("a", a))  # again: nothing more
    txns.prepare(TXN, Entry("b", b))
    assert [(p.namespace, p.upload_id) for p in txns.pending()] == [("a", a), ("b", b)]
    assert [p.upload_id for p in txns.pending("b")] == [b]
    assert _latest(vault, "a") is None
    with pytest.raises(UploadPrepared):
        vault.committer.commit(a)  # only through its transaction
    with pytest.raises(UploadPrepared):
        vault.uploads.abort(a)
    with pytest.raises(Conflict):
        txns.prepare("cd" * 16, Entry("a", a))  # held by another transaction
    rec, created = txns.apply(TXN, a)
    assert created
    assert txns.apply(TXN, a) == (rec, False)  # a retry: the same checkpoint
    txns.abort(TXN, b)  # released: open again, committed on its own
    assert [p.upload_id for p in txns.pending()] == []
    assert vault.committer.commit(b)[0].namespace == "b"


def test_a_refused_upload_is_not_prepared(vault: Vault) -> None:
    txns = _txns(vault)
    session, _ = vault.open_upload("c")
    files = {"f": CommitFile(10, None, ["0" * 64])}
    with pytest.raises(MissingChunks, match="namespace 'c'"):
        txns.prepare(TXN, Entry("c", session.id, files))
    assert txns.pending() == []


def test_a_prepared_upload_is_in_the_replica(tmp_path: Path) -> None:
    tier = LocalTier(str(tmp_path / "tier"), "cold")
    config = ReplicationConfig(tier="cold")
    primary = Vault(tmp_path / "primary", tiers={"cold": tier}, replication=config)
    try:
        upload = _upload(primary, "ns", b"state " * 1000)
        _txns(primary).prepare(TXN, Entry("ns", upload))
        _wait_caught_up(primary)
    finally:
        primary.close()
    restore_replica(tier, tmp_path / "restored")
    restored = Vault(tmp_path / "restored")
    try:
        txns = _txns(restored)
        assert [p.transaction for p in txns.pending("ns")] == [TXN]
        rec, _ = txns.apply(TXN, upload)
        assert read_file(restored, "ns", rec.id, "f") == b"state " * 1000
        assert txns.pending() == []
    finally:
        restored.close()
