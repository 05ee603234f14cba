"""The decisions of commits across namespaces, kept in the cluster's store.

Two-phase commit with presumed abort, whose one decision is an object: `txn/<id>` holds
`commit` or `abort`, written with a conditional create (If-None-Match: *), the store's
only consensus and the one the leases use. The coordinator writes `commit` once every
owner prepared its upload (vault/txn.py); anyone who finds an upload prepared for longer
than the timeout with no decision writes `abort` the same way. Whoever creates the object
first decides; everyone else reads what it says. A decision is never changed, so an owner
may act on it whenever it reads it: apply (commit) or drop (abort) its upload, both
idempotent.
"""

from __future__ import annotations

import json
import time

from checkpoint_vault.vault.errors import ObjectExists, ObjectNotFound, TierError
from checkpoint_vault.vault.tier import Tier
from checkpoint_vault.vault.txn import PreparedUpload, Transactions

from .config import ClusterConfig

COMMIT = "commit"
ABORT = "abort"
# Seconds an upload may stay prepared with no decision before whoever finds it writes
# `abort`: longer than a coordinator needs between its first prepare and its decision
# (prepares of large files prove hashes: seconds), short enough that a dead coordinator
# keeps nothing waiting long. Reads never wait on it: an undecided upload is not visible.
TXN_TIMEOUT = ClusterConfig.txn_timeout


def decision_key(transaction: str) -> str:
    return f"txn/{transaction}"


class Decisions:
    def __init__(self, tier: Tier, by: str) -> None:
        """`tier`: the cluster's objects; `by`: who decides (a node's name, for people)."""
        self._tier = tier
        self._by = by

    def decide(self, transaction: str, decision: str) -> str:
        """Try to decide `transaction`; returns the decision that holds (ours, or the one
        someone created first)."""
        body = json.dumps({"decision": decision, "by": self._by, "at": time.time()})
        try:
            self._tier.put(decision_key(transaction), body.encode(), if_absent=True)
        except ObjectExists:
            held = self.read(transaction)
            if held is None:  # created, then gone: the store broke its promise
                raise TierError(f"decision of {transaction} exists and cannot be read") from None
            return held
        return decision

    def read(self, transaction: str) -> str | None:
        """The decision, or None while there is none."""
        try:
            raw = self._tier.get(decision_key(transaction))
        except ObjectNotFound:
            return None
        decision = json.loads(raw)["decision"]
        if decision not in (COMMIT, ABORT):
            raise TierError(f"decision of {transaction} is neither commit nor abort")
        return str(decision)


def resolve(
    txns: Transactions,
    decisions: Decisions,
    upload: PreparedUpload,
    now: float,
    timeout: float = TXN_TIMEOUT,
) -> str | None:
    """Bring one prepared upload to its transaction's decision (blocking): applied on
    `commit`, dropped on `abort`; past `timeout` undecided, `abort` is proposed first.
    Returns the decision, or None (undecided, within the timeout: left as it is)."""
    decision = decisions.read(upload.transaction)
    if decision is None and now - upload.prepared_at >= timeout:
        decision = decisions.decide(upload.transaction, ABORT)
    if decision == COMMIT:
        txns.apply(upload.transaction, upload.upload_id)
    elif decision == ABORT:
        txns.abort(upload.transaction, upload.upload_id)
    return decision
