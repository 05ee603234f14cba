"""The audit log's per-token index (vault/audit.py) is built for a log written before it."""

from __future__ import annotations

import json
from pathlib import Path

from checkpoint_vault.vault import Vault
from checkpoint_vault.vault.audit import BYTES_BY, INDEXED


def test_a_log_written_before_the_index_is_indexed_at_open(tmp_path: Path) -> None:
    vault = Vault(tmp_path / "v")
    env, counters = vault.store.catalog_env, vault.store.counters
    k1, k2, k3 = (n.to_bytes(8, "big") + bytes(4) for n in (1, 2, 3))
    entries = {
        k1: {"token": "a", "action": "x"},
        k2: {"token": "b", "action": "y"},
        k3: {"token": "a", "action": "z"},
    }

    def older_version(w: object) -> None:  # as a version without the index left it
        txn = w.catalog  # type: ignore[attr-defined]
        txn.drop(env.db["auditby"], delete=False)
        for key, entry in entries.items():
            txn.put(key, json.dumps(entry).encode(), db=env.db["audit"])
        counters.add(txn, INDEXED, -counters.get(txn, INDEXED))

    vault.store.writer.run(older_version)
    vault.close()
    vault = Vault(tmp_path / "v")
    env, counters = vault.store.catalog_env, vault.store.counters
    with env.read() as txn:
        index = [bytes(k) for k, _ in txn.cursor(db=env.db["auditby"])]
        sizes = counters.with_prefix(txn, BYTES_BY)
        assert counters.get(txn, INDEXED) == 1
    assert index == [b"a\0" + k1, b"a\0" + k3, b"b\0" + k2]
    size = {k: len(json.dumps(e).encode()) for k, e in entries.items()}
    assert sizes == {"a": size[k1] + size[k3], "b": size[k2]}
    vault.close()
