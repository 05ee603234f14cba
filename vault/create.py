"""The one way a checkpoint comes into being.

Commit of an upload session, the one-request save and fork all end in `create`, inside a
writer transaction, so they share every rule: a parent named by the request was resolved to
a live checkpoint when the request named it (else 404); files not listed are inherited from
that parent, which must still be live at creation (else 409: the upload was accepted, the
world changed since); every chunk the manifest names must be stored and sound (else
`missing_chunks`, whatever the caller was told earlier: GC may have run since); then the
record, manifest, indexes and reference counts are written together (invariant 3 in
docs/DESIGN.md).
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import lmdb

from . import quotas
from .errors import Conflict, MissingChunks
from .manifest import FileEntry, distinct_chunks
from .records import NamespaceRecord, StoredCheckpoint

if TYPE_CHECKING:
    from .catalog import Catalog
    from .config import VaultConfig
    from .content.chunks import Chunks
    from .ids import IdGenerator


class CreateParts(Protocol):
    """What creating a checkpoint needs of the store: catalog, chunks, settings and ids."""

    @property
    def catalog(self) -> Catalog: ...
    @property
    def chunks(self) -> Chunks: ...
    @property
    def config(self) -> VaultConfig: ...
    @property
    def ids(self) -> IdGenerator: ...


@dataclass(frozen=True)
class Draft:
    """Everything a new checkpoint is made of, checked before the writer transaction."""

    namespace: str
    parent: str | None  # a checkpoint id, resolved when the request named it
    inherit: bool
    metadata: dict[str, Any]
    tags: list[str]
    files: dict[str, FileEntry]
    created_by: str | None = None  # token name, for append-only rules
    id: str | None = None  # given (a save-journal record applied again), else issued now


def ensure_namespace(
    store: CreateParts, txn: lmdb.Transaction, ns: str, profile: dict[str, Any], now: float
) -> NamespaceRecord:
    """The namespace's record, created with `profile` if this is its first checkpoint."""
    rec = store.catalog.namespace(txn, ns)
    if rec is None:
        rec = NamespaceRecord(ns, profile, now)
        store.catalog.put_namespace(txn, rec)
    return rec


def inherited(
    store: CreateParts, txn: lmdb.Transaction, parent: str | None
) -> dict[str, FileEntry]:
    """The parent's files, for `inherit`; the parent must still be live."""
    rec = store.catalog.record(txn, parent) if parent is not None else None
    if rec is None or rec.is_tombstone:
        raise Conflict(f"parent {parent} was deleted; cannot inherit its files")
    return store.catalog.manifest(txn, rec.id)


def create(
    store: CreateParts,
    txn: lmdb.Transaction,
    draft: Draft,
    now: float,
    sound: Container[bytes] = (),
    quota: bool = True,
    ns_rec: NamespaceRecord | None = None,
) -> StoredCheckpoint:
    """Make the checkpoint visible (writer thread, inside the caller's transaction).
    `sound`: chunks this same transaction found usable or stored already (a one-request
    save's), which need no second look. `quota` False: checked already (a commit across
    namespaces checks it at prepare, vault/txn.py). `ns_rec`: the namespace's record as
    this same transaction read it (`ensure_namespace`), not read a second time."""
    files = dict(draft.files)
    if draft.inherit:
        for name, entry in inherited(store, txn, draft.parent).items():
            files.setdefault(name, entry)
    usable = store.chunks.usable
    missing = [c.hex() for c in distinct_chunks(files) if c not in sound and not usable(txn, c)]
    if missing:
        raise MissingChunks(missing)
    if quota and store.config.quotas:
        size = sum(e.size for e in files.values())
        quotas.check(txn, store.catalog, store.config.quotas, draft.namespace, size)
    if draft.id is not None:
        store.ids.follow(draft.id)  # ids issued later still sort after it
    return store.catalog.create(
        txn,
        draft.id if draft.id is not None else store.ids.next(int(now * 1000)),
        draft.namespace,
        draft.parent,
        draft.metadata,
        draft.tags,
        files,
        now,
        draft.created_by,
        ns_rec,
    )
