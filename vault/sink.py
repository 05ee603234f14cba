"""Keeping chunks in a writer transaction: the writer-side half of every chunk upload
(streamed, batched and one-request saves), with what it needs of the store declared here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .content.chunks import Chunks
    from .counters import Counters
    from .writer import Writer, WriteTxn


class ChunkSink(Protocol):
    """What `store_all` needs of the store: the chunk table, the writer and its counters."""

    @property
    def chunks(self) -> Chunks: ...
    @property
    def counters(self) -> Counters: ...
    @property
    def writer(self) -> Writer: ...
    def now_ms(self) -> int: ...


def store_all(
    store: ChunkSink,
    w: WriteTxn,
    items: Mapping[bytes, tuple[bytes | memoryview, bytes | memoryview | None]],
    reserve_until_ms: int,
    inline: bool = False,
) -> list[bytes]:
    """Writer-side half of every chunk upload: keep each (data, frame-or-None). Returns the
    ids of the chunks this wrote (the others were stored and sound already)."""
    now_ms = store.now_ms()
    written: list[bytes] = []
    added = grown = 0
    for cid, (data, frame) in items.items():
        if frame is None and not reserve_until_ms and store.chunks.usable(w.catalog, cid):
            continue  # known sound and nothing to reserve: what `store` would conclude
        wrote, n, b = store.chunks.store(w, cid, data, frame, now_ms, reserve_until_ms, inline)
        if wrote:
            written.append(cid)
        added += n
        grown += b
    store.writer.stats.chunks_written += len(written)  # writer thread only: no lock needed
    store.writer.stats.chunks_deduplicated += len(items) - len(written)
    if added:
        store.counters.add(w.catalog, "chunks", added)
    if grown:
        store.counters.add(w.catalog, "stored_bytes", grown)
    return written
