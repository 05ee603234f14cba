"""A saver's atomic block: the checkpoints and pending writes a graph, its subgraphs and
any other thread put inside it become records together, or none does.

Inside the block each save a put or put_writes would make is held (`_steps.Staging`), in
call order; its end stages each held save into an upload of its own the way any save
over the upload routes is staged (`AsyncVaultClient._stage_save`: its files in flight
together, one progress bar), and commits them all in one `POST /v1/commits`
(`AsyncVaultClient._commit_uploads`, as `commit_all` and `commit_uploads` do): on one
server in one transaction, across a cluster's shards all or nothing. A put whose parent
is held too cannot inherit from it (it has no record yet), so it sends every value; the
vault stores only the chunks it lacks. Pruning (`keep_last`) waits for the block to end,
since a held save may inherit from a record a prune would delete.
"""

from __future__ import annotations

from ..aio import AsyncVaultClient, _all
from ..chunking import collect_sources
from ..models import Checkpoint as Record
from ._memo import Held, Memo
from ._steps import Save


async def commit(client: AsyncVaultClient, memo: Memo, saves: list[Save]) -> list[Record]:
    """Commit the held `saves` as one transaction; their records, in order."""
    if not saves:
        return []
    staged = await _all(
        [client._stage_save(s.namespace, collect_sources(s.files), s.options) for s in saves]
    )
    records = await client._commit_uploads([s.entry for s in staged], None)
    for save, rec in zip(saves, records, strict=True):
        if save.key is not None:  # a checkpoint: the next put inherits from it
            memo.committed.put(save.key, Held.of(rec))
    return records
