"""A consistent read of the catalog for planners outside the engine.

The tiering planner (tiering/policy.py) decides over every namespace, checkpoint, manifest
and chunk location at once, and must see one catalog state while it does. It gets that
state through this read-only view of one catalog read transaction, never the transaction,
the store or its tables: the engine stays free to change how any of them is kept.
Keep a snapshot short: an open read transaction holds back map growth.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

import lmdb

from .content.chunks import ChunkMeta
from .manifest import FileEntry
from .policy import Policies, Policy
from .records import StoredCheckpoint

if TYPE_CHECKING:
    from .catalog import Catalog
    from .content.chunks import Chunks
    from .env import Env
    from .tier import Tier


class SnapshotParts(Protocol):
    """What a catalog snapshot reads."""

    @property
    def catalog(self) -> Catalog: ...
    @property
    def catalog_env(self) -> Env: ...
    @property
    def chunks(self) -> Chunks: ...
    @property
    def tiers(self) -> Mapping[str, Tier]: ...


class Snapshot:
    def __init__(self, store: SnapshotParts, policies: Policies, txn: lmdb.Transaction) -> None:
        self._s = store
        self._policies = policies
        self._txn = txn

    def namespaces(self) -> list[str]:
        return [ns.name for ns in self._s.catalog.namespaces(self._txn)]

    def own_policy(self, ns: str | None) -> Policy | None:
        """A namespace's own policy (the default's with ns=None), or None if it has none."""
        return self._policies.get(self._txn, ns)

    def policy_for(self, ns: str) -> Policy:
        """The policy in force for `ns`: its own, else the default."""
        return self._policies.effective(self._txn, ns)

    def live_records(self, ns: str) -> list[StoredCheckpoint]:
        """A namespace's live checkpoints, newest first."""
        out = []
        for cid in self._s.catalog.ids(self._txn, ns):
            rec = self._s.catalog.record(self._txn, cid)
            if rec is not None:
                out.append(rec)
        return out

    def record(self, ckpt_id: str) -> StoredCheckpoint | None:
        return self._s.catalog.record(self._txn, ckpt_id)

    def manifest(self, ckpt_id: str) -> dict[str, FileEntry]:
        return self._s.catalog.manifest(self._txn, ckpt_id)

    def manifests(self) -> Iterator[tuple[str, dict[str, FileEntry]]]:
        """Every live checkpoint's id and manifest."""
        return self._s.catalog.all_manifests(self._txn)

    def chunk(self, cid: bytes) -> ChunkMeta | None:
        return self._s.chunks.meta(self._txn, cid)

    def tier_totals(self) -> dict[str, dict[str, int]]:
        return self._s.chunks.tier_totals(self._txn, self._s.tiers)


@contextmanager
def snapshot(store: SnapshotParts, policies: Policies) -> Iterator[Snapshot]:
    with store.catalog_env.read() as txn:
        yield Snapshot(store, policies, txn)
