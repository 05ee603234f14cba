"""Commits across namespaces, the HTTP side (vault/txn.py and cluster/txn.py are the
engine's): the coordinator of `POST /v1/commits` (coordinator.py), and in every process the
resolver and the reads that settle a namespace's prepared uploads first (resolving.py)."""

from .coordinator import commit_across
from .resolving import TXN, TxnService, txn_context, txn_middleware

__all__ = ["TXN", "TxnService", "commit_across", "txn_context", "txn_middleware"]
