"""Applying retention: plan every namespace, then delete exactly what the plan says.

The plan is computed from one catalog snapshot, including the bytes deletion would really
free: a chunk is freed only if every checkpoint that references it is being deleted.
Deletion runs in writer transactions of up to DELETE_BATCH checkpoints; a checkpoint pinned
or deleted since the plan was made is skipped, never forced.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Protocol

import lmdb

from checkpoint_vault.protocol import RetentionReport

from .errors import CheckpointNotFound
from .manifest import distinct_chunks
from .names import PARTS
from .policy import Policies
from .records import StoredCheckpoint
from .retention import NamespacePlan, plan_namespace
from .writer import WriteTxn

if TYPE_CHECKING:
    from .catalog import Catalog
    from .clock import Clock
    from .content.chunks import Chunks
    from .env import Env
    from .writer import Writer


class PruneParts(Protocol):
    """What retention needs of the store."""

    @property
    def catalog(self) -> Catalog: ...
    @property
    def catalog_env(self) -> Env: ...
    @property
    def chunks(self) -> Chunks: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def writer(self) -> Writer: ...


DELETE_BATCH = 256


def report(plans: list[NamespacePlan], deleted: list[str], dry_run: bool) -> RetentionReport:
    """The answer of a retention run: each namespace's plan, and what was deleted."""
    return RetentionReport(dry_run, {p.namespace: p.to_record() for p in plans}, deleted)


def live_records(catalog: Catalog, txn: lmdb.Transaction, ns: str) -> list[StoredCheckpoint]:
    out = []
    for cid in catalog.ids(txn, ns):
        rec = catalog.record(txn, cid)
        if rec is not None:
            out.append(rec)
    return out


def plan(
    store: PruneParts, policies: Policies, namespace: str | None = None
) -> list[NamespacePlan]:
    now = store.clock.now()
    plans = []
    with store.catalog_env.read() as txn:
        everyone = (n.name for n in store.catalog.namespaces(txn) if n.name != PARTS)
        names = [namespace] if namespace else list(everyone)  # parts expire on their own
        if namespace:
            store.catalog.require_namespace(txn, namespace)
        for ns in names:
            policy = policies.effective(txn, ns).retention
            plans.append(plan_namespace(ns, live_records(store.catalog, txn, ns), policy, now))
        doomed = store.catalog.released_refs(txn, (cid for p in plans for cid in p.delete))
        freed: dict[bytes, int] = {}
        for chunk, n in doomed.items():
            meta = store.chunks.meta(txn, chunk)
            if meta is not None and meta.refs <= n:
                freed[chunk] = meta.stored
        _keep_needed_bases(store, txn, freed)
        for p in plans:  # attribute each freed chunk to one namespace's plan
            for cid in p.delete:
                for chunk in distinct_chunks(store.catalog.manifest(txn, cid)):
                    p.reclaimable_bytes += freed.pop(chunk, 0)
    return plans


def _keep_needed_bases(store: PruneParts, txn: lmdb.Transaction, freed: dict[bytes, int]) -> None:
    """Take out of `freed` every chunk a chunk that stays needs as its base (a patch of a
    small file, vault/smallfile.py, or a compaction delta): GC keeps those."""
    todo = list(freed)
    while todo:
        chunk = todo.pop()
        if chunk in freed and any(d not in freed for d in store.chunks.dependents(txn, chunk)):
            del freed[chunk]
            base = store.chunks.base_of(txn, chunk)  # its base is needed again in turn
            if base is not None:
                todo.append(base)


def apply(store: PruneParts, plans: list[NamespacePlan]) -> list[str]:
    """Delete what the plans say; returns the ids actually deleted."""
    todo = [(p.namespace, cid) for p in plans for cid in p.delete]
    deleted: list[str] = []
    for i in range(0, len(todo), DELETE_BATCH):
        batch = todo[i : i + DELETE_BATCH]
        deleted.extend(store.writer.run(functools.partial(_delete, store, batch=batch)))
    return deleted


def _delete(store: PruneParts, w: WriteTxn, *, batch: list[tuple[str, str]]) -> list[str]:
    done = []
    now = store.clock.now()
    for ns, cid in batch:
        try:
            rec = store.catalog.resolve(w.catalog, ns, cid)
        except CheckpointNotFound:
            continue  # deleted since the plan
        if rec.pinned:
            continue  # pinned since the plan: pins always win
        store.catalog.remove(w.catalog, rec, now)
        done.append(cid)
    return done
