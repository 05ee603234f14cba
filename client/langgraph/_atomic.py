"""A saver's atomic block: the checkpoints and pending writes a graph, its subgraphs and
any other thread put inside it become records together, or none does.

Inside the block each save a put or put_writes would make is held (`_steps.Staging`), in
call order; its end opens an upload per held save, sends its files, and commits them all
in one `POST /v1/commits` (`AsyncVaultClient.commit_uploads`): on one server in one
transaction, across a cluster's shards all or nothing. A put whose parent is held too
cannot inherit from it (it has no record yet), so it sends every value; the vault stores
only the chunks it lacks. Pruning (`keep_last`) waits for the block to end, since a held
save may inherit from a record a prune would delete.
"""

from __future__ import annotations

import asyncio

from checkpoint_vault.protocol import CommitFile

from ..aio import AsyncVaultClient, UploadSession
from ..models import Checkpoint as Record
from ._memo import Held, Memo
from ._steps import Save


async def commit(client: AsyncVaultClient, memo: Memo, saves: list[Save]) -> list[Record]:
    """Commit the held `saves` as one transaction; their records, in order."""
    if not saves:
        return []
    staged = await asyncio.gather(*(_stage(client, s) for s in saves))
    records = await client.commit_uploads(staged)
    for save, rec in zip(saves, records, strict=True):
        if save.key is not None:  # a checkpoint: the next put inherits from it
            memo.committed.put(save.key, Held.of(rec))
    return records


async def _stage(
    client: AsyncVaultClient, save: Save
) -> tuple[UploadSession, dict[str, CommitFile]]:
    up = await client._open_upload(save.namespace, save.options)
    files = {}
    for name, data in save.files.items():
        files[name] = await client.send_file(up, name, data)
    return up, files
