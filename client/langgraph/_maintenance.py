"""Whole-thread operations: listing, deleting, copying (by fork), pruning.

Each is a handful of list requests and then one request per record changed: the vault
has no bulk delete or namespace delete, so a thread of n records costs n DELETEs (eight
in flight at a time).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

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
DELETES_IN_FLIGHT = 8


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
        if len(page) < size:
            return
        before, size = page[-1].id, min(PAGE, size * 2)


async def all_records(client: AsyncVaultClient, namespace: str) -> list[Record]:
    return [rec async for rec in records(client, namespace, first=PAGE)]


async def delete(client: AsyncVaultClient, doomed: list[Record]) -> None:
    slots = asyncio.Semaphore(DELETES_IN_FLIGHT)

    async def one(rec: Record) -> None:
        async with slots:
            with contextlib.suppress(NotFound):  # deleted meanwhile (a concurrent prune)
                await client.delete(rec.namespace, rec.id)

    await asyncio.gather(*(one(rec) for rec in doomed))


async def thread_namespaces(client: AsyncVaultClient, layout: Layout) -> list[str]:
    return [n["name"] for n in await client.namespaces() if layout.owns(n["name"])]


async def delete_thread(client: AsyncVaultClient, namespace: str) -> None:
    await delete(client, await all_records(client, namespace))


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
