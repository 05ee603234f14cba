"""Server-side chunking of a streamed file, piece by piece, with bounded memory.

The HTTP layer reads the request body in pieces and hands each to `FileIngest.feed` on a
worker thread. Feeding piece k+1 overlaps the writer thread's commit of piece k; at most one
piece's writes are outstanding, so memory stays at a few pieces whatever the file size.
"""

from __future__ import annotations

from concurrent.futures import Future

import blake3
import lmdb

from .chunking import ChunkingProfile, StreamChunker
from .frame import Encoder, chunk_id
from .manifest import FileEntry
from .names import check_file_name
from .store import Store
from .uploads import Uploads


class FileIngest:
    """One file being streamed into an upload session. Not thread-safe: feed in order."""

    def __init__(self, store: Store, uploads: Uploads, upload_id: str, name: str) -> None:
        self._s = store
        self._uploads = uploads
        self._upload_id = upload_id
        self.name = check_file_name(name)
        with store.env.read() as txn:
            session = uploads.live(txn, upload_id)
            profile: ChunkingProfile = store.catalog.require_namespace(
                txn, session.namespace
            ).chunking()
        self._until_ms = int(session.expires_at * 1000)
        self._chunker = StreamChunker(profile)
        self._hash = blake3.blake3()
        self._encoder = Encoder()
        self._chunks: list[tuple[bytes, int]] = []
        self._size = 0
        self._pending: Future[None] | None = None

    def feed(self, piece: bytes, final: bool = False) -> None:
        self._hash.update(piece)
        self._size += len(piece)
        chunks = self._chunker.feed(piece, final)
        ids = [chunk_id(c) for c in chunks]
        self._chunks.extend(zip(ids, (len(c) for c in chunks), strict=True))
        with self._s.env.read() as txn:
            known = {c for c in set(ids) if self._s.blocks.usable(txn, c)}
        new: dict[bytes, tuple[int, bytes]] = {}
        present: dict[bytes, memoryview] = {}
        for cid, data in zip(ids, chunks, strict=True):
            if cid in known:
                present[cid] = data
            elif cid not in new:
                new[cid] = (len(data), self._encoder.encode(data))
        self._wait()
        if new or present:
            self._pending = self._s.writer.submit(
                lambda txn: self._store(txn, new, present),
                size=sum(len(f) for _, f in new.values()),
            )

    def _store(
        self,
        txn: lmdb.Transaction,
        new: dict[bytes, tuple[int, bytes]],
        present: dict[bytes, memoryview],
    ) -> None:
        now_ms = self._s.now_ms()
        for cid, (size, frame) in new.items():
            self._s.blocks.put(txn, cid, size, frame, now_ms, self._until_ms)
        for cid, data in present.items():
            meta = self._s.blocks.meta(txn, cid)
            if meta is not None and not meta.damaged:
                self._s.blocks.reserve(txn, cid, meta, self._until_ms)
            else:  # collected or damaged since we looked: store our copy after all
                frame = Encoder().encode(data)
                self._s.blocks.put(txn, cid, len(data), frame, now_ms, self._until_ms)

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def finish(self) -> FileEntry:
        """Wait for every chunk to be durable, then attach the file to the session."""
        self._wait()
        entry = FileEntry(self._size, self._hash.digest(), tuple(self._chunks))
        self._uploads.add_file(self._upload_id, self.name, entry)
        return entry
