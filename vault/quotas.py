"""Storage quotas per namespace glob: the logical bytes of live checkpoints a group of
namespaces may hold.

Logical, not stored, bytes: with dedup a chunk belongs to no single tenant, and what a
tenant makes the vault store is at most what it keeps logically (dedup only ever lowers
it), so a logical quota bounds the storage a tenant can consume, which stored-byte
accounting could not attribute. Checked inside the writer transaction that creates a
checkpoint (commit, one-request save, fork): over it, 507 `quota_exceeded` and nothing
is made. Usage is summed from the namespace records under the glob's literal prefix (one
cursor range), so a check costs one record read per namespace of that tenant. A commit
also checks it from the sizes it lists before reading any chunk (vault/commit.py). The
refusal names the quota only, never the glob or its usage: a glob may be shared.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import TYPE_CHECKING

import lmdb

from .errors import QuotaExceeded

if TYPE_CHECKING:
    from .catalog import Catalog


@dataclass(frozen=True)
class Quota:
    glob: str  # fnmatch pattern over namespace names, as in token scopes
    logical_bytes: int

    def covers(self, ns: str) -> bool:
        return fnmatch.fnmatchcase(ns, self.glob)

    @property
    def prefix(self) -> str:
        """The glob's literal head: every namespace it matches starts with it."""
        for i, c in enumerate(self.glob):
            if c in "*?[":
                return self.glob[:i]
        return self.glob


def usage(txn: lmdb.Transaction, catalog: Catalog, quota: Quota) -> int:
    """Logical bytes of live checkpoints in the namespaces `quota` covers."""
    covered = catalog.namespaces_under(txn, quota.prefix, quota.covers)
    return sum(ns.logical_bytes for ns in covered)


def check(
    txn: lmdb.Transaction, catalog: Catalog, quotas: tuple[Quota, ...], ns: str, adding: int
) -> None:
    """Raise QuotaExceeded if `adding` logical bytes to `ns` would pass a quota over it."""
    for quota in quotas:
        if adding > 0 and quota.covers(ns):
            used = usage(txn, catalog, quota)
            if used + adding > quota.logical_bytes:
                # The quota only: its glob and usage may cover other tenants' namespaces.
                raise QuotaExceeded(
                    f"namespace {ns!r} is under a {quota.logical_bytes}-byte storage quota "
                    f"that this checkpoint's {adding} bytes would pass: delete some "
                    "checkpoints (retention) first"
                )
