"""Reading chunks back: every byte is verified against its id before it leaves the engine.

Metadata comes from the catalog, frames from the frame environment. A chunk that fails
verification (or whose frame is gone while the catalog still lists it) is flagged damaged on
the spot, so the missing query starts reporting it and the next upload of the same bytes
heals it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import blake3

from .blocks import INLINE, ChunkMeta
from .errors import BlockCorrupt
from .frame import Decoder
from .manifest import FileEntry
from .store import Store
from .writer import WriteTxn

READ_BATCH_BYTES = 4 << 20  # per worker-thread call: amortizes the hop, bounds memory


class Reader:
    def __init__(self, store: Store) -> None:
        self._s = store

    def _locate(self, cids: Sequence[bytes]) -> tuple[list[ChunkMeta], dict[bytes, bytes]]:
        """Metadata of each chunk, and the frames of inline ones (copied out of the map)."""
        inline: dict[bytes, bytes] = {}
        metas: list[ChunkMeta] = []
        with self._s.env.read() as txn:
            for cid in cids:
                meta = self._s.blocks.meta(txn, cid)
                if meta is None:
                    raise BlockCorrupt(cid.hex())
                if meta.seq == INLINE and cid not in inline:
                    frame = self._s.blocks.inline_frame(txn, cid)
                    if frame is not None:
                        inline[cid] = bytes(frame)
                metas.append(meta)
        return metas, inline

    def _plaintexts(
        self, cids: Sequence[bytes], verify: bool = True
    ) -> Iterator[bytes | memoryview]:
        """Verified plaintext of each chunk, valid until the next item is taken."""
        metas, inline = self._locate(cids)
        decoder = Decoder()
        with self._s.frames.read() as txn:
            for cid, meta in zip(cids, metas, strict=True):
                frame = inline.get(cid) if meta.seq == INLINE else self._s.blocks.frame(txn, meta)
                try:
                    if frame is None:
                        raise BlockCorrupt(cid.hex())
                    yield decoder.plaintext(frame, cid, verify)
                except BlockCorrupt:
                    self._flag_damaged(cid)
                    raise
        self._s.frames.note_io(sum(m.stored for m in metas))

    def chunks(self, cids: Sequence[bytes]) -> list[bytes]:
        """Verified plaintext of each chunk, in order."""
        return [d if isinstance(d, bytes) else bytes(d) for d in self._plaintexts(cids)]

    def _flag_damaged(self, cid: bytes) -> None:
        def op(w: WriteTxn) -> None:
            self._s.blocks.mark_damaged(w.cat, cid)

        self._s.writer.submit(op)

    def file_hash(self, entry: FileEntry) -> bytes:
        """BLAKE3 of the file as stored, read straight from the memory map.

        Chunks are not re-hashed one by one here: each was verified when it was stored, and
        a damaged one makes the file hash differ anyway, which refuses the commit."""
        h = blake3.blake3()
        for batch in batches(entry.chunks):
            for data in self._plaintexts(batch, verify=False):
                h.update(data)
        return h.digest()


def batches(
    chunks: Sequence[tuple[bytes, int]], limit: int = READ_BATCH_BYTES
) -> Iterator[list[bytes]]:
    """Group chunk ids into runs of about `limit` plaintext bytes."""
    batch: list[bytes] = []
    size = 0
    for cid, n in chunks:
        batch.append(cid)
        size += n
        if size >= limit:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch
