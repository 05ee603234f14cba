"""cluster/txn.py: a transaction's decision is created once and read by everyone, however
many decide at once; the resolver applies, releases, or (past the timeout) aborts."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from checkpoint_vault.cluster.txn import ABORT, COMMIT, Decisions, resolve
from checkpoint_vault.tiering.backends.local import LocalTier
from checkpoint_vault.vault import Vault
from checkpoint_vault.vault.txn import Entry, Transactions


def test_the_first_decision_holds_under_a_race(tmp_path: Path) -> None:
    tier = LocalTier(str(tmp_path / "store"), "cluster")
    for round_ in range(5):
        txn = f"{round_:02d}" * 16
        wanted = [COMMIT if i % 2 else ABORT for i in range(16)]
        with ThreadPoolExecutor(16) as pool:
            got = list(pool.map(lambda d, t=txn: Decisions(tier, "n").decide(t, d), wanted))
        assert len(set(got)) == 1
        assert Decisions(tier, "other").read(txn) == got[0]
    assert Decisions(tier, "n").read("ff" * 16) is None


def test_resolve_acts_on_the_decision_or_aborts_past_the_timeout(
    tmp_path: Path, vault: Vault
) -> None:
    decisions = Decisions(LocalTier(str(tmp_path / "store"), "cluster"), "n")
    txns = Transactions(vault.store, vault.uploads, vault.committer)
    uploads = {}
    for ns in ("a", "b"):
        session, _ = vault.open_upload(ns)
        txns.prepare(ns * 32, Entry(ns, session.id))
        uploads[ns] = session.id
    a, b = (p for p in txns.pending())
    now = a.prepared_at
    assert resolve(txns, decisions, a, now + 1, timeout=30) is None  # undecided, in time
    decisions.decide(a.transaction, COMMIT)
    assert resolve(txns, decisions, a, now + 1, timeout=30) == COMMIT
    assert vault.get("a", "latest").id
    assert resolve(txns, decisions, b, now + 31, timeout=30) == ABORT  # proposed, and won
    assert decisions.read(b.transaction) == ABORT
    assert txns.pending() == []
    assert vault.committer.commit(uploads["b"])[1]  # released: open again
