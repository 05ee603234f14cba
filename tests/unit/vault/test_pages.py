"""vault/pages.py reads LMDB's on-disk layout privately: pinned to the versions it was
written against, so an upgrade that changes the layout fails here, not in a shrink."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import lmdb

from checkpoint_vault.vault.pages import read_free_list

# The layout read at fixed offsets is LMDB 0.9's (64-bit); py-lmdb 3.0 bundles 0.9.36.
# pyproject.toml bounds `lmdb` below the next major release for the same reason.
WRITTEN_AGAINST_LMDB = (0, 9)
WRITTEN_AGAINST_PY_LMDB = "3.0"


def test_the_bundled_lmdb_is_the_one_pages_reads() -> None:
    assert lmdb.version()[:2] == WRITTEN_AGAINST_LMDB, lmdb.version()
    installed = importlib.metadata.version("lmdb")
    assert installed.startswith(WRITTEN_AGAINST_PY_LMDB), (
        f"py-lmdb {installed}: check vault/pages.py's offsets against its LMDB, then move "
        "this pin and pyproject.toml's bound"
    )


def test_a_fresh_environment_reads(tmp_path: Path) -> None:
    """The offsets still name a meta page, a transaction and the free database's root."""
    env = lmdb.open(str(tmp_path / "env"), map_size=1 << 24)
    try:
        with env.begin(write=True) as txn:
            for i in range(200):
                txn.put(b"%04d" % i, b"x" * 3000)
        with env.begin(write=True) as txn:
            for i in range(100):
                txn.delete(b"%04d" % i)
        with open(tmp_path / "env" / "data.mdb", "rb") as f:
            free = read_free_list(env, f.fileno())
        assert free.txnid == env.info()["last_txnid"]
        assert free.free_pages > 0
        assert free.last_page == env.info()["last_pgno"]
    finally:
        env.close()
