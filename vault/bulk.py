"""Deleting many checkpoints of a namespace in one call (a LangGraph thread, at once).

One request instead of one per checkpoint: `delete_thread` of a 100-turn chat was ~900
DELETEs. Deletion runs in writer transactions of up to `DELETE_BATCH` checkpoints, each
exactly like a single delete (tombstone, references dropped); a pinned checkpoint is kept
and reported, never an error that would leave the rest undone, and ids already gone are
reported as such, so a retried bulk delete is harmless.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from .errors import CheckpointNotFound
from .prune import DELETE_BATCH
from .writer import WriteTxn

if TYPE_CHECKING:
    from .catalog import Catalog
    from .clock import Clock
    from .env import Env
    from .writer import Writer


class BulkParts(Protocol):
    """What a bulk delete needs of the store."""

    @property
    def catalog(self) -> Catalog: ...
    @property
    def catalog_env(self) -> Env: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def writer(self) -> Writer: ...


@dataclass
class BulkDeleted:
    deleted: list[str] = field(default_factory=list)
    pinned: list[str] = field(default_factory=list)  # kept: pins always win
    not_found: list[str] = field(default_factory=list)  # unknown or already deleted


def delete_many(store: BulkParts, ns: str, ids: Sequence[str] | None) -> BulkDeleted:
    """Delete `ids` of `ns` (None: every live checkpoint it has now)."""
    with store.catalog_env.read() as txn:
        store.catalog.require_namespace(txn, ns)
        todo = list(dict.fromkeys(ids)) if ids is not None else list(store.catalog.ids(txn, ns))
    out = BulkDeleted()
    for i in range(0, len(todo), DELETE_BATCH):
        part = store.writer.run(functools.partial(_delete, store, ns, todo[i : i + DELETE_BATCH]))
        out.deleted += part.deleted
        out.pinned += part.pinned
        out.not_found += part.not_found
    return out


def _delete(store: BulkParts, ns: str, ids: list[str], w: WriteTxn) -> BulkDeleted:
    """One writer transaction; returns what it did (no outside state: the writer may run
    an operation twice when the map grows)."""
    out = BulkDeleted()
    now = store.clock.now()
    for cid in ids:
        try:
            rec = store.catalog.resolve(w.catalog, ns, cid)
        except CheckpointNotFound:
            out.not_found.append(cid)
            continue
        if rec.pinned:
            out.pinned.append(cid)
            continue
        store.catalog.remove(w.catalog, rec, now)
        out.deleted.append(cid)
    return out
