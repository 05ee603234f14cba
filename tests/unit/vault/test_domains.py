"""The dedup-domain index (vault/domains.py) stays equal to a rebuild from the manifests
through every way checkpoints come and go, and decides presence per caller."""

from __future__ import annotations

from checkpoint_vault.vault import Vault
from checkpoint_vault.vault.frame import chunk_id

from .helpers import client_save, stream_save


def _index(vault: Vault) -> dict[bytes, int]:
    env = vault.store.catalog_env
    with env.read() as txn:
        return {bytes(k): int.from_bytes(v, "little") for k, v in txn.cursor(db=env.db["nsrefs"])}


def _rebuilt(vault: Vault) -> dict[bytes, int]:
    env = vault.store.catalog_env
    with env.lmdb.begin(write=True) as txn:  # rebuilt in a transaction thrown away
        vault.catalog.build_nsrefs(txn)
        out = {bytes(k): int.from_bytes(v, "little") for k, v in txn.cursor(db=env.db["nsrefs"])}
        txn.abort()
    return out


def test_index_matches_a_rebuild_through_saves_forks_and_deletes(vault: Vault) -> None:
    shared = b"s" * 4000
    a1 = client_save(vault, "a", {"f": shared + b"1" * 1000})
    client_save(vault, "a", {"f": shared + b"2" * 1000})
    vault.save("b", {"g": b"g" * 3000})
    fork = vault.lifecycle.fork("a", a1.id, "c")
    stream_save(vault, "b", {"h": shared})
    assert _index(vault) == _rebuilt(vault)
    vault.lifecycle.delete("a", a1.id)
    vault.lifecycle.delete("c", fork.id)
    assert _index(vault) == _rebuilt(vault)
    names = {k[32:].decode() for k in _index(vault)}
    assert names == {"a", "b"}  # c held only the fork, now deleted


def test_presence_depends_on_the_callers_namespaces(vault: Vault) -> None:
    client_save(vault, "a", {"f": b"x" * 1000})
    cid = chunk_id(b"x" * 1000).hex()
    up, _ = vault.open_upload("b")
    assert vault.uploads.missing(up.id, [cid], domain=lambda ns: ns == "b") == [cid]
    assert vault.uploads.missing(up.id, [cid], domain=lambda ns: ns in ("a", "b")) == []
    assert vault.uploads.missing(up.id, [cid]) == []  # no domain: admin and offline callers


def test_check_finds_and_repairs_a_drifted_domain_index(vault: Vault) -> None:
    client_save(vault, "a", {"f": b"x" * 5000})
    client_save(vault, "b", {"f": b"y" * 5000})
    assert vault.check().domain_drift == 0
    db = vault.store.catalog_env.db["nsrefs"]
    vault.store.writer.run(lambda w: w.catalog.drop(db, delete=False))
    broken = vault.check()
    assert broken.domain_drift > 0
    assert not broken.ok
    vault.check(repair=True)
    assert vault.check().ok
