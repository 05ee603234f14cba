"""Server-side chunking of a streamed file, piece by piece, with bounded memory.

The HTTP layer reads the request body in pieces and hands each to `FileIngest.feed` on a
worker thread. Feeding piece k+1 overlaps the writer thread's commit of piece k; at most one
piece's writes are outstanding, so memory stays at a few pieces whatever the file size.
"""

from __future__ import annotations

import fcntl
import os
import stat
import threading
from collections import deque
from concurrent.futures import Future, wait
from typing import TYPE_CHECKING, Protocol

import blake3

from .chunking import ChunkingProfile, StreamChunker, tensor_regions
from .domains import Domain, cached
from .errors import InvalidRequest, Unavailable
from .frame import Encoder, chunk_id
from .manifest import FileEntry
from .names import check_file_name
from .sink import ChunkSink, store_all
from .uploads import Uploads, acked_here
from .writer import WriteTxn

if TYPE_CHECKING:
    from .catalog import Catalog
    from .env import Env
    from .runtime import Runtime


class IngestParts(ChunkSink, Protocol):
    """What streaming a file in needs of the store: keeping chunks (`ChunkSink`), the
    catalog's tables, and the runtime's threads that store pieces."""

    @property
    def catalog(self) -> Catalog: ...
    @property
    def catalog_env(self) -> Env: ...
    @property
    def runtime(self) -> Runtime: ...


class FileIngest:
    """One file being streamed into an upload session. Not thread-safe: feed in order."""

    def __init__(
        self, store: IngestParts, uploads: Uploads, upload_id: str, name: str, domain: Domain = None
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
        self._local = acked_here(session)
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
                return len(store_all(self._s, w, items, self._until_ms))

            self._pending = self._s.writer.submit(
                op,
                size=sum(len(f) for _, f in items.values() if f is not None),
                local=self._local,
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


O_PATH = getattr(os, "O_PATH", 0)  # a descriptor that names a file without opening it
DESCRIPTOR_PIECE = 8 << 20  # read, cut and hashed at a time
STORING = 2  # pieces being stored meanwhile


def ingest_descriptor(
    store: IngestParts,
    uploads: Uploads,
    upload_id: str,
    name: str,
    fd: int,
    domain: Domain = None,
    stop: threading.Event | None = None,
) -> FileEntry:
    """Chunk the open file `fd` into an upload and attach it, reading it here: what a client
    on this machine hands over instead of sending the bytes (api/transfer/receive.py).

    Cut exactly as a client would cut the same file (its tensors found first, the
    upload's profile), so its chunks dedup with those of files that came over HTTP. This
    thread reads, cuts and hashes the file piece by piece; each piece's chunks are named and
    stored on another thread, as chunk batches are (`Uploads.put_chunks`: staged, durable
    by the commit), two pieces at a time, so one is named and framed while the writer
    applies the other. At most three pieces are held. The file is read once: what it holds
    when read is what is stored, and its hash is of those bytes."""
    name = check_file_name(name)
    info = handed_over_file(fd, writing=False)
    with store.catalog_env.read() as txn:
        session = uploads.live(txn, upload_id)
        profile = store.catalog.require_namespace(txn, session.namespace).chunking()
    regions: list[tuple[int, int]] = []
    if profile.tensor_pieces:
        with open(os.dup(fd), "rb") as f:  # its own object; reads below are positioned
            regions = tensor_regions(f, info.st_size, profile.tensor_pieces)
    chunker = StreamChunker(profile, regions=regions)
    file_hash = blake3.blake3()
    listing: list[tuple[bytes, int]] = []
    size = 0
    storing: deque[Future[list[tuple[bytes, int]]]] = deque()

    def name_and_store(cut: list[memoryview]) -> list[tuple[bytes, int]]:
        chunks = [(chunk_id(c), c) for c in cut]
        uploads.put_chunks(upload_id, chunks, domain, named_here=True)
        return [(cid, len(c)) for cid, c in chunks]

    try:
        while True:
            if stop is not None and stop.is_set():
                raise Unavailable("the server is shutting down; save the file again")
            piece = _read_piece(fd, size)
            final = len(piece) < DESCRIPTOR_PIECE
            cut = chunker.feed(piece, final)
            if len(storing) == STORING:
                listing.extend(storing.popleft().result())
            if cut:
                storing.append(store.runtime.store.submit(name_and_store, cut))
            file_hash.update(piece)  # while the pieces are named and stored
            size += len(piece)
            if final:
                break
        while storing:
            listing.extend(storing.popleft().result())
    except BaseException:
        wait(storing)  # nothing of this file runs on behind the error
        raise
    entry = FileEntry(size, file_hash.digest(), tuple(listing))
    uploads.add_file(upload_id, name, entry)
    return entry


def handed_over_file(fd: int, *, writing: bool) -> os.stat_result:
    """The descriptor a client handed over, checked: one regular file, open for reading
    (`ingest_descriptor`) or for writing but not appending, where every write would land
    at the end whatever its offset (vault/deliver.py)."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise InvalidRequest("the descriptor handed over is not a regular file")
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    access = flags & os.O_ACCMODE
    if writing:
        if access not in (os.O_WRONLY, os.O_RDWR):
            raise InvalidRequest("the file handed over is not open for writing")
        if flags & os.O_APPEND:
            raise InvalidRequest("the file handed over is open for appending")
    elif flags & O_PATH or access not in (os.O_RDONLY, os.O_RDWR):
        raise InvalidRequest("the file handed over is not open for reading")
    return info


def _read_piece(fd: int, offset: int) -> bytes:
    """DESCRIPTOR_PIECE bytes from `offset`, fewer only at the end of the file."""
    try:
        parts = [os.pread(fd, DESCRIPTOR_PIECE, offset)]
        got = len(parts[0])
        while 0 < got < DESCRIPTOR_PIECE:
            more = os.pread(fd, DESCRIPTOR_PIECE - got, offset + got)
            if not more:
                break
            parts.append(more)
            got += len(more)
    except OSError as e:
        raise InvalidRequest(f"the file handed over could not be read: {e.strerror}") from None
    return parts[0] if len(parts) == 1 else b"".join(parts)
