"""A small file of a one-request save as one chunk: one frame, one set of bookkeeping.

An agent's 40 kB state cut into ~17 chunks cost the writer ~17 metadata lookups, ~17
domain counts read and written, and the same again for references, for a save that
changed one message: the writer's transaction made ~52 LMDB reads and ~38 writes where
PostgreSQL writes one row. Here a file of at most `WHOLE_MAX` bytes saved in one request
is one chunk whose id is the file's BLAKE3 (the entry's hash, computed once), so a save
stores a record, a manifest, an entry and at most one frame whatever the state's size.

What chunking bought, storing only what changed, comes back as a patch (vault/frame.py):
zstd of the file with the same file's plaintext in the parent as raw-content dictionary,
so a state that grew by a message stores ~0.4 kB. The parent's chunk becomes the patch's
base, linked as compaction links a delta (`deltas`, `bases`): GC keeps a base while a
patch needs it, a damaged base flags its patches, compaction leaves patches alone until
their base is kept only for them, and no read decodes more than `MAX_CHAIN` of them (a
file whose parent's chain is that deep is stored whole, zstd, and starts a new chain).

The worker that prepares a save finds the base (the parent's manifest, read in its own
snapshot) and its plaintext in `RecentFiles`, the files it prepared lately. An agent's next
save comes to another worker process about as often as to the same one (the kernel spreads
connections over them), and reading the base back there (its chain decoded) cost ~0.3 ms a
time; so a worker that lacks it leaves the frame to the process that writes (`patch_here`),
whose own `RecentFiles` holds every small file it committed lately, whichever worker
prepared it. A vault saving in its own process reads the base back instead. The writer
checks again in its transaction that the base is sound and the chain within bounds
(compaction may have deepened it, GC may have taken an unreferenced base); if not, or if it
lacks the base's plaintext too, the file is stored whole instead (`Whole.frame`).
`BaseCounts` counts how each small file's base was found (`/metrics`
`ckpt_small_file_bases_total`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping

import lmdb

from .content.chunks import Chunks
from .content.reader import MAX_CHAIN, Reader
from .errors import VaultError
from .frame import Encoder, delta_base

WHOLE_MAX = 256 << 10  # a file up to this size is one chunk in a one-request save
RECENT_BYTES = 16 << 20  # plaintexts `RecentFiles` keeps, per process
PATCH_KEEP_FRACTION = 2  # a patch is kept only if at most 1/2 of the whole frame
PATCH_SURE_FRACTION = 16  # a patch of at most 1/16 of the file is kept without comparing


def can_patch(chunks: Chunks, txn: lmdb.Transaction, base: bytes, depth: int | None = None) -> bool:
    """Whether a new chunk may be a patch against `base` in snapshot `txn`: the base is
    stored and sound, and a read of the patch then decodes at most MAX_CHAIN deltas.
    `depth`: the deltas a read of `base` decodes, if known (else its chain is walked)."""
    if not chunks.usable(txn, base):
        return False
    if depth is None:
        depth = len(chunks.chain(txn, base, MAX_CHAIN)) - 1
    return depth < MAX_CHAIN


def bases(
    chunks: Chunks,
    txn: lmdb.Transaction,
    parent: Mapping[str, tuple[tuple[bytes, int], ...]],
    depths: Mapping[bytes, int],
) -> dict[str, tuple[bytes, int]]:
    """Per file name, the chunk a new version of that file may patch against and the
    deltas a read of it decodes: the parent's file when it is one chunk (a small file
    saved in one request) that `can_patch`. `depths`: those this process knows already
    (`RecentFiles.depth`); the writer checks again."""
    out: dict[str, tuple[bytes, int]] = {}
    for name, chunk_list in parent.items():
        if len(chunk_list) == 1 and chunk_list[0][1] <= WHOLE_MAX:
            base = chunk_list[0][0]
            depth = depths.get(base)
            if depth is None:
                depth = len(chunks.chain(txn, base, MAX_CHAIN)) - 1
            if can_patch(chunks, txn, base, depth):
                out[name] = (base, depth)
    return out


class RecentFiles:
    """The plaintexts of the small files this process prepared or read lately, by chunk id
    (each verified: its id was computed from these bytes), so that the next save of the
    same file patches against it without reading it back."""

    def __init__(self, reader: Reader, max_bytes: int = RECENT_BYTES) -> None:
        self._reader = reader
        self._max = max_bytes
        self._held = 0
        self._files: OrderedDict[bytes, bytes] = OrderedDict()
        self._depths: dict[bytes, int] = {}  # deltas a read decodes, of those prepared here
        self._lock = threading.Lock()  # saves are prepared on several threads at once

    def remember(self, cid: bytes, data: bytes, depth: int | None = None) -> None:
        """Keep `data`, the plaintext of chunk `cid`; `depth`: the deltas a read of it
        decodes as this process stored it (a later compaction may change that)."""
        with self._lock:
            if depth is not None:
                self._depths[cid] = depth
            if cid in self._files or len(data) > self._max:
                return
            self._files[cid] = data
            self._held += len(data)
            while self._held > self._max:
                old_cid, old = self._files.popitem(last=False)
                self._depths.pop(old_cid, None)
                self._held -= len(old)

    def depths(self, cids: list[bytes]) -> dict[bytes, int]:
        with self._lock:
            return {c: self._depths[c] for c in cids if c in self._depths}

    def cached(self, cid: bytes) -> bytes | None:
        """The plaintext of chunk `cid` if this process holds it (never read back)."""
        with self._lock:
            data = self._files.get(cid)
            if data is not None:
                self._files.move_to_end(cid)
            return data

    def plaintext(self, cid: bytes) -> bytes | None:
        """The verified plaintext of chunk `cid`, or None if it cannot be read now (the
        save then stores its file whole)."""
        with self._lock:
            data = self._files.get(cid)
            if data is not None:
                self._files.move_to_end(cid)
                return data
        try:
            plain = bytes(self._reader.chunks([cid])[0])
        except VaultError:
            return None
        self.remember(cid, plain)
        return plain


BASE_SOURCES = ("recent", "read", "writer", "writer_missed")


class BaseCounts:
    """How the base of each small file saved as a new version of its parent's was found,
    since start: `recent` (the preparing process held it), `read` (read back and decoded),
    `writer` (left to the process that writes, which held it) and `writer_missed` (left to
    it, which did not, or found the base unusable: stored whole)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # prepared on the loop and the pool; the writer thread
        self._counts = dict.fromkeys(BASE_SOURCES, 0)

    def count(self, how: str, n: int = 1) -> None:
        with self._lock:
            self._counts[how] += n

    def totals(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class Whole:
    """Frames of small files: a patch against the base when that pays, else whole."""

    def __init__(self, encoder: Encoder) -> None:
        self._encoder = encoder

    def frame(self, data: bytes | memoryview, base_id: bytes | None, base: bytes | None) -> bytes:
        if base_id is not None and base is not None:
            patch = self._encoder.patch(data, base_id, base)
            if len(patch) <= len(data) // PATCH_SURE_FRACTION:
                return patch  # whole, zstd saves at most ~4x on text: no need to compare
            whole = self._encoder.encode(data)
            return patch if len(patch) <= len(whole) // PATCH_KEEP_FRACTION else whole
        return self._encoder.encode(data)


def patch_base(frame: bytes | memoryview | None) -> bytes | None:
    """The base a prepared frame patches against (None: whole, or no frame)."""
    return delta_base(frame) if frame is not None else None
