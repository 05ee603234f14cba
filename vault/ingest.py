"""Server-side chunking of a streamed file, piece by piece, with bounded memory.

The HTTP layer reads the request body in pieces and hands each to `FileIngest.feed` on a
worker thread. Feeding piece k+1 overlaps the writer thread's commit of piece k; at most one
piece's writes are outstanding, so memory stays at a few pieces whatever the file size.
"""

from __future__ import annotations

from concurrent.futures import Future

import blake3

from .chunking import ChunkingProfile, StreamChunker
from .domains import Domain, cached
from .frame import Encoder, chunk_id
from .manifest import FileEntry
from .names import check_file_name
from .store import Store, store_all
from .uploads import Uploads
from .writer import WriteTxn


class FileIngest:
    """One file being streamed into an upload session. Not thread-safe: feed in order."""

    def __init__(
        self, store: Store, uploads: Uploads, upload_id: str, name: str, domain: Domain = None
    ) -> None:
        self._s = store
        self._uploads = uploads
        self._domain = cached(domain)
        self._upload_id = upload_id
        self.name = check_file_name(name)
        with store.catalog_env.read() as txn:
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
        self._pending: Future[int] | None = None

    def feed(self, piece: bytes, final: bool = False) -> None:
        self._hash.update(piece)
        self._size += len(piece)
        chunks = self._chunker.feed(piece, final)
        ids = [chunk_id(c) for c in chunks]
        self._chunks.extend(zip(ids, (len(c) for c in chunks), strict=True))
        with self._s.catalog_env.read() as txn:
            known = {c for c in set(ids) if self._s.chunks.usable(txn, c)}
            seen = {
                c for c in known if self._uploads.present(txn, self._upload_id, c, self._domain)
            }
        items: dict[bytes, tuple[memoryview, bytes | None]] = {}
        for cid, data in zip(ids, chunks, strict=True):
            if cid not in items:
                items[cid] = (data, None if cid in known else self._encoder.encode(data))
        self._wait()
        if items:
            # Charged: bytes new to the caller, stored elsewhere or not, so the limit
            # answers the same whether another tenant holds them (vault/domains.py).
            fresh = sum(len(d) for c, (d, _) in items.items() if c not in seen)

            def op(w: WriteTxn) -> int:
                self._uploads.charge(w.catalog, self._upload_id, fresh)
                return store_all(self._s, w, items, self._until_ms)

            self._pending = self._s.writer.submit(
                op, size=sum(len(f) for _, f in items.values() if f is not None)
            )

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
