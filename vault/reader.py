"""Reading chunks back: every byte is verified against its id before it leaves the engine.

A chunk that fails verification is flagged damaged on the spot, so the missing query starts
reporting it and the next upload of the same bytes heals it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import blake3
import lmdb

from .errors import BlockCorrupt
from .frame import Decoder
from .manifest import FileEntry
from .store import Store

READ_BATCH_BYTES = 4 << 20  # per worker-thread call: amortizes the hop, bounds memory


class Reader:
    def __init__(self, store: Store) -> None:
        self._s = store

    def chunks(self, cids: Sequence[bytes]) -> list[bytes]:
        """Verified plaintext of each chunk, in order."""
        decoder = Decoder()
        out: list[bytes] = []
        with self._s.env.read() as txn:
            for cid in cids:
                frame = self._s.blocks.frame(txn, cid)
                try:
                    if frame is None:
                        raise BlockCorrupt(cid.hex())
                    data = decoder.plaintext(frame, cid)
                except BlockCorrupt:
                    self._flag_damaged(cid)
                    raise
                out.append(data if isinstance(data, bytes) else bytes(data))
        self._s.env.note_io(sum(len(d) for d in out))
        return out

    def _flag_damaged(self, cid: bytes) -> None:
        def op(txn: lmdb.Transaction) -> None:
            self._s.blocks.mark_damaged(txn, cid)

        self._s.writer.submit(op)

    def file_hash(self, entry: FileEntry) -> bytes:
        """BLAKE3 of the file as stored, read straight from the memory map."""
        h = blake3.blake3()
        decoder = Decoder()
        for batch in batches(entry.chunks):
            with self._s.env.read() as txn:
                for cid in batch:
                    frame = self._s.blocks.frame(txn, cid)
                    if frame is None:
                        raise BlockCorrupt(cid.hex())
                    h.update(decoder.plaintext(frame, cid))
            self._s.env.note_io(READ_BATCH_BYTES)
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
