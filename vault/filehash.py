"""Running file hashes: a file's BLAKE3 built while its chunks arrive, so its commit need
not read the whole file back.

A commit proves each listed file's hash from the stored chunks (vault/commit.py); for a
1 GB file that was 0.4-0.7 s alone at the end of the save, on one core. A client that sends
a file's chunks as whole pieces can say where each batch starts in which file (`POST
.../chunks?file=&offset=`); the server then hashes the verified chunks in file order on
the worker that verified them, holding back one batch that arrives ahead of its
predecessor (two are in flight). The commit uses the result only if the chunk ids it
hashed, in order, are exactly the file's list, so what a client claims about positions
can waste this work but never change a hash: anything else (a gap, a resend, a chunk the
vault already had and was not sent) leaves the commit to read the file as before. A batch
may name chunks of the file the vault already has instead of carrying them (references,
protocol/_bodies.py: a torch.save file repeats the weights its safetensors sibling
sent); those are hashed from the store here, on the worker, rather than at the commit.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import blake3

from .errors import VaultError

# Files hashed at once across all uploads (the oldest is dropped past it), and batches one
# may hold back for their predecessor: at most 8 x 1 batch bodies (<= 64 MiB each) held.
MAX_FILES = 8
MAX_AHEAD = 1

# (id, bytes) of a chunk that came with the batch, or (id, size) of one the vault has.
Chunks = Sequence[tuple[bytes, bytes | memoryview | int]]
# Feeds a hash the stored plaintexts of (id, size) chunks, in order (Reader.hash_into).
HashStored = Callable[[Sequence[tuple[bytes, int]], "blake3.blake3"], None]


class _Running:
    def __init__(self, hash_stored: HashStored) -> None:
        self.hash = blake3.blake3()
        self.size = 0  # bytes hashed: the offset the next batch must start at
        self.ids: list[bytes] = []
        self.ahead: dict[int, Chunks] = {}
        self.broken = False
        self.lock = threading.Lock()
        self._hash_stored = hash_stored

    def feed(self, offset: int, chunks: Chunks) -> None:
        with self.lock:
            if self.broken:
                return
            if offset != self.size:
                if offset < self.size or offset in self.ahead or len(self.ahead) >= MAX_AHEAD:
                    self._give_up()
                else:
                    self.ahead[offset] = chunks
                return
            self._take(chunks)
            while not self.broken and self.size in self.ahead:
                self._take(self.ahead.pop(self.size))

    def _take(self, chunks: Chunks) -> None:
        stored: list[tuple[bytes, int]] = []
        for cid, data in chunks:
            if isinstance(data, int):
                stored.append((cid, data))
                continue
            if stored and not self._take_stored(stored):
                return
            stored = []
            self.hash.update(data)
            self.size += len(data)
            self.ids.append(cid)
        if stored:
            self._take_stored(stored)

    def _take_stored(self, stored: list[tuple[bytes, int]]) -> bool:
        try:
            self._hash_stored(stored, self.hash)
        except VaultError:  # unreadable now (a tier offline): the commit will say so
            self._give_up()
            return False
        self.size += sum(n for _, n in stored)
        self.ids.extend(cid for cid, _ in stored)
        return True

    def _give_up(self) -> None:
        self.broken = True
        self.ahead.clear()
        self.ids.clear()


class RunningHashes:
    """The running hashes of files being uploaded, by (upload id, file name)."""

    def __init__(self, hash_stored: HashStored) -> None:
        self._files: OrderedDict[tuple[str, str], _Running] = OrderedDict()
        self._lock = threading.Lock()
        self._hash_stored = hash_stored

    def feed(self, upload_id: str, name: str, offset: int, chunks: Chunks) -> None:
        """Verified `chunks`, in order, that start at `offset` of file `name`; the ones
        given by size are read from the store (sound, and the caller may see them)."""
        with self._lock:
            running = self._files.get((upload_id, name))
            if running is None:
                running = self._files[(upload_id, name)] = _Running(self._hash_stored)
                while len(self._files) > MAX_FILES:
                    self._files.popitem(last=False)
        running.feed(offset, chunks)

    def digest(self, upload_id: str, name: str, cids: Sequence[bytes]) -> bytes | None:
        """The hash of file `name` if exactly `cids`, in order, were hashed for it."""
        with self._lock:
            running = self._files.get((upload_id, name))
        if running is None:
            return None
        with running.lock:
            if running.broken or running.ahead or running.ids != list(cids):
                return None
            return running.hash.digest()

    def forget(self, upload_id: str) -> None:
        """Drop an upload's files (committed or aborted)."""
        with self._lock:
            for key in [k for k in self._files if k[0] == upload_id]:
                del self._files[key]
