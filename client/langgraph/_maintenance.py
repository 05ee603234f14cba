"""Whole-thread operations: listing, deleting, copying (by fork), pruning.

Deleting is one request per thread (`delete_many`, the vault's bulk delete: a thread of
n records was n DELETEs); pruning and `delete_for_runs` list the records, then delete the
chosen ones in one request. Pinned records stay (a pin always wins).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

from ..aio import AsyncVaultClient
from ..errors import NotFound
from ..models import Checkpoint as Record
from ._layout import KIND_CHECKPOINT, Layout, Ref
from ._retention import plan_prune

# A tag-filtered listing makes the server read records newest first until it has `limit`
# matches, so small first pages stop the read early: the latest checkpoint is usually the
# newest record or close to it, and a checkpoint by id usually has one writes record above
# it. Pages then double up to PAGE.
FIRST_PAGE = 4
BY_ID_PAGE = 2
PAGE = 200


async def records(
    client: AsyncVaultClient, namespace: str, *, tag: str | None = None, first: int = FIRST_PAGE
) -> AsyncGenerator[Record, None]:
    """Records of a namespace newest first, page by page (none if it does not exist)."""
    before, size = None, first
    while True:
        try:
            page = await client.list(namespace, limit=size, before=before, tag=tag)
        except NotFound:
            return
        for rec in page:
            yield rec
        if (more := next_page(page, size)) is None:
            return
        before, size = more


def next_page(page: list[Record], size: int) -> tuple[str, int] | None:
    """Where a listing goes on after `page`, asked for `size` records: (before, size), or
    None when it was the last."""
    if len(page) < size:
        return None
    return page[-1].id, min(PAGE, size * 2)


def next_page_wire(page: Sequence[Mapping[str, Any]], size: int) -> tuple[str, int] | None:
    """`next_page` of a page of records as the server's JSON."""
    if len(page) < size:
        return None
    return str(page[-1]["id"]), min(PAGE, size * 2)


async def all_records(client: AsyncVaultClient, namespace: str) -> list[Record]:
    return [rec async for rec in records(client, namespace, first=PAGE)]


async def delete(client: AsyncVaultClient, doomed: list[Record]) -> None:
    """One request per namespace; records deleted meanwhile (a concurrent prune) are
    simply reported gone by the vault."""
    by_ns: dict[str, list[str]] = {}
    for rec in doomed:
        by_ns.setdefault(rec.namespace, []).append(rec.id)
    for namespace, ids in by_ns.items():
        with contextlib.suppress(NotFound):  # the namespace itself is unknown
            await client.delete_many(namespace, ids)


async def thread_namespaces(client: AsyncVaultClient, layout: Layout) -> list[str]:
    return [n.name for n in await client.namespaces() if layout.owns(n.name)]


async def delete_thread(client: AsyncVaultClient, namespace: str) -> None:
    """Every record of the thread, in one request; an emptied namespace is no longer
    listed, so the thread disappears from `list(None)` too."""
    with contextlib.suppress(NotFound):  # never saved: nothing to delete
        await client.delete_many(namespace)


async def prune(client: AsyncVaultClient, namespace: str, keep: int) -> None:
    await delete(client, plan_prune(await all_records(client, namespace), keep))


async def delete_for_runs(client: AsyncVaultClient, layout: Layout, run_ids: set[str]) -> None:
    """Every checkpoint whose metadata names one of the runs, with its writes. Reads every
    record under the prefix: the vault has no index on metadata."""
    for namespace in await thread_namespaces(client, layout):
        found = await all_records(client, namespace)
        doomed: set[tuple[str, str]] = set()
        for rec in found:
            ref = Ref.of(rec)
            run = (rec.metadata.get("metadata") or {}).get("run_id")
            if ref and ref.kind == KIND_CHECKPOINT and str(run) in run_ids:
                doomed.add((ref.checkpoint_ns, ref.checkpoint_id))
        await delete(client, [r for r in found if _key(r) in doomed])


async def copy_thread(client: AsyncVaultClient, source: str, target: str, thread_id: str) -> None:
    """Fork every record of `source` into `target`, oldest first so the copy keeps the
    commit order reads rely on. A fork shares the source's chunks: no bytes are copied."""
    for rec in reversed(await all_records(client, source)):
        if Ref.of(rec) is None:
            continue
        metadata = {**rec.metadata, "thread_id": thread_id}
        await client.fork(source, rec.id, target, metadata=metadata, tags=rec.tags)


def _key(rec: Record) -> tuple[str, str] | None:
    ref = Ref.of(rec)
    return None if ref is None else (ref.checkpoint_ns, ref.checkpoint_id)
