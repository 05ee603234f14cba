"""File entries stored once, by content: what makes many small checkpoints cheap.

An agent saves its state after every step, and most files of a step are the parent's
files unchanged (inherited). Stored per checkpoint, every manifest repeated every file's
chunk list (36 bytes per chunk: ~3 KB for a 150 KB message history), and every commit
incremented the reference count of every chunk of every file: ~90 random keys of
`chunkmeta`, so ~25 B-tree pages rewritten and synced per save, measured as ~180 KB
written per 150 KB agent save. Here a file entry (size, hash, chunk list) is stored once
under the BLAKE3 of its encoding (`entries`), with its own reference count
(`entryrefs`, apart so a count change rewrites a few bytes, not an overflow page); a
manifest names its files' entries (`manifest.encode_manifest_refs`).

An entry that shares most of its chunk list with the same file's entry in the parent
checkpoint (a message history that grew: FastCDC cuts the unchanged part alike) is stored
as a delta: the base entry's digest, runs of the base's chunks to copy, and the chunks of
its own in between (`diff`). Chains are at most `MAX_DEPTH` deltas long (then the entry
is stored whole), so reading an entry costs at most that many lookups, whatever the
history.

Reference counting has three levels. An entry's count is the number of (live checkpoint,
file name) pairs naming it plus the number of live delta entries based on it; a chunk's
count is the number of live entries whose stored list (a delta's own chunks, a whole
entry's all) holds it, each entry counting a chunk once, plus, for checkpoints written
before entries existed (their manifests still hold whole chunk lists), one per such
checkpoint listing it. So a commit that inherits an unchanged file changes one small count,
and a chunk's count still reaches zero exactly when nothing live can read it: GC,
retention's reclaimable bytes and `check` keep their meaning. The price of deltas: a live
entry keeps its bases, so the chunks only older versions held (a grown file's old last
chunk) stay until the whole chain is unreferenced; chains end every `MAX_DEPTH` versions,
or sooner once their versions' own chunks reach `MAX_CHAIN_BYTES`.
"""

from __future__ import annotations

import struct
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import blake3
import lmdb

from .content.chunks import Chunks
from .env import Env
from .manifest import FileEntry

MAX_DEPTH = 32  # deltas in a chain; the next one is stored whole
# A live delta keeps its chain alive, and with it chunks only older versions held (their own
# chunks); a chain ends (the next version is stored whole) before those exceed this, so
# deleted versions pin at most this much per file: agent state (a few KB of new chunks
# per version) chains to MAX_DEPTH, a tensor file with 100 MB changed never deltas.
MAX_CHAIN_BYTES = 4 << 20
# Resolved entries kept in memory (a digest names fixed content), bounded by chunks listed
# (~100 B each in memory: 256 Ki chunks is ~25 MiB); one entry of a 10 GiB tensor file
# lists ~160 Ki chunks, so larger entries than CACHE_ENTRY_CHUNKS are not kept.
CACHE_CHUNKS = 1 << 18
CACHE_ENTRY_CHUNKS = 1 << 14
MIN_SHARED = 0.5  # store a delta only if at least this fraction of chunks is shared
_REFS = struct.Struct("<I")
_WHOLE = b"W"
_DELTA = b"D"
_DELTA_HEAD = struct.Struct("<32sHQI")  # base digest, depth, chain bytes, number of runs
_RUN = struct.Struct("<BII")  # kind, start (in the base; unused for own chunks), count
_ENTRY_HEAD = struct.Struct("<Q32sI")  # manifest.FileEntry's: size, hash, chunk count
COPY, OWN = 0, 1

ChunkList = tuple[tuple[bytes, int], ...]
Run = tuple[int, int, int]  # (COPY, start in base, count) or (OWN, 0, count)


def entry_digest(entry: FileEntry) -> bytes:
    """The entry's key: BLAKE3-256 of its whole binary form (size, hash, chunk list),
    whichever way it is stored."""
    return blake3.blake3(entry.to_bytes()).digest()


def diff(chunks: ChunkList, base: ChunkList) -> tuple[list[Run], ChunkList]:
    """`chunks` as runs copied from `base` and runs of its own chunks (returned too).
    Greedy: at each position, the longest run starting where the chunk first occurs in the
    base. A re-serialized list typically differs at its head (a count) and its tail."""
    first: dict[tuple[bytes, int], int] = {}
    for j, c in enumerate(base):
        first.setdefault(c, j)
    runs: list[Run] = []
    own: list[tuple[bytes, int]] = []
    i = 0
    while i < len(chunks):
        at = first.get(chunks[i])
        if at is None:
            own.append(chunks[i])
            if runs and runs[-1][0] == OWN:
                runs[-1] = (OWN, 0, runs[-1][2] + 1)
            else:
                runs.append((OWN, 0, 1))
            i += 1
            continue
        k = 1
        while i + k < len(chunks) and at + k < len(base) and chunks[i + k] == base[at + k]:
            k += 1
        runs.append((COPY, at, k))
        i += k
    return runs, tuple(own)


@dataclass(frozen=True)
class Body:
    """An entry as stored: whole (`base` None, `own` is the chunk list), or `runs` copying
    from the `base` entry's chunks and taking `own` chunks in turn."""

    size: int
    hash: bytes
    own: ChunkList
    base: bytes | None = None
    runs: tuple[Run, ...] = ()
    depth: int = 0
    chain_bytes: int = 0  # plaintext of the own chunks of this delta and the deltas below it

    def to_bytes(self) -> bytes:
        own = FileEntry(self.size, self.hash, self.own).to_bytes()
        if self.base is None:
            return _WHOLE + own
        head = _DELTA_HEAD.pack(self.base, self.depth, self.chain_bytes, len(self.runs))
        return b"".join([_DELTA, head, *(_RUN.pack(*r) for r in self.runs), own])

    @classmethod
    def from_bytes(cls, raw: bytes | memoryview) -> Body:
        view = memoryview(raw)
        if bytes(view[:1]) == _WHOLE:
            e, _ = FileEntry.from_view(view[1:])
            return cls(e.size, e.hash, e.chunks)
        base, depth, chain_bytes, n = _DELTA_HEAD.unpack_from(view, 1)
        pos = 1 + _DELTA_HEAD.size
        runs = tuple(_RUN.iter_unpack(view[pos : pos + n * _RUN.size]))
        e, _ = FileEntry.from_view(view[pos + n * _RUN.size :])
        return cls(e.size, e.hash, e.chunks, bytes(base), runs, depth, chain_bytes)

    def resolve(self, base: ChunkList) -> ChunkList:
        """The whole chunk list, given the base entry's."""
        out: list[tuple[bytes, int]] = []
        taken = 0
        for kind, start, count in self.runs:
            if kind == COPY:
                out.extend(base[start : start + count])
            else:
                out.extend(self.own[taken : taken + count])
                taken += count
        return tuple(out)

    def own_chunks(self) -> set[bytes]:
        """The chunks this stored entry holds a reference on."""
        return {cid for cid, _ in self.own}


class Entries:
    """Writer-side changes and reads of stored file entries (inside callers' txns)."""

    def __init__(self, env: Env, chunks: Chunks) -> None:
        self._bodies = env.db["entries"]
        self._refs = env.db["entryrefs"]
        self._chunks = chunks
        # Resolving a delta walks its chain; the entries of an agent's latest checkpoints
        # are read again at every save (inherit, the next delta's base). A digest names its
        # content, so a cached entry can never be stale, only absent from the catalog,
        # which callers learn from the manifest or the body first.
        self._cache: OrderedDict[bytes, FileEntry] = OrderedDict()
        self._cached_chunks = 0
        self._lock = threading.Lock()

    def body(self, txn: lmdb.Transaction, digest: bytes) -> Body | None:
        raw = txn.get(digest, db=self._bodies)
        return None if raw is None else Body.from_bytes(raw)

    def head(self, txn: lmdb.Transaction, digest: bytes) -> tuple[int, bytes] | None:
        """(size, whole-file hash) of an entry, without reading its chunk list."""
        raw = txn.get(digest, db=self._bodies)
        if raw is None:
            return None
        view = memoryview(raw)
        pos = 1
        if bytes(view[:1]) == _DELTA:
            *_, runs = _DELTA_HEAD.unpack_from(view, 1)
            pos += _DELTA_HEAD.size + runs * _RUN.size
        size, digest32, _ = _ENTRY_HEAD.unpack_from(view, pos)
        return int(size), bytes(digest32)

    def get(self, txn: lmdb.Transaction, digest: bytes) -> FileEntry | None:
        """The whole entry, its delta chain resolved; None if it (or a base) is missing."""
        with self._lock:
            hit = self._cache.get(digest)
            if hit is not None:
                self._cache.move_to_end(digest)
        if hit is not None and txn.get(digest, db=self._refs) is not None:
            return hit
        body = self.body(txn, digest)
        if body is None:
            return None
        if body.base is None:
            entry = FileEntry(body.size, body.hash, body.own)
        else:
            base = self.get(txn, body.base)
            if base is None:
                return None
            entry = FileEntry(body.size, body.hash, body.resolve(base.chunks))
        if len(entry.chunks) <= CACHE_ENTRY_CHUNKS:
            self._remember(digest, entry)
        return entry

    def _remember(self, digest: bytes, entry: FileEntry) -> None:
        with self._lock:
            if digest not in self._cache:
                self._cache[digest] = entry
                self._cached_chunks += len(entry.chunks)
            while self._cached_chunks > CACHE_CHUNKS:
                _, old = self._cache.popitem(last=False)
                self._cached_chunks -= len(old.chunks)

    def refs(self, txn: lmdb.Transaction, digest: bytes) -> int:
        raw = txn.get(digest, db=self._refs)
        return 0 if raw is None else int(_REFS.unpack(bytes(raw))[0])

    def add(
        self,
        txn: lmdb.Transaction,
        digest: bytes,
        entry: FileEntry,
        now_ms: int,
        base: bytes | None = None,
    ) -> None:
        """One more reference; the first stores the entry (as a delta against `base`, the
        same file's entry in the parent, when worth it) and references its chunks."""
        n = self.refs(txn, digest)
        if n == 0:
            body = self._delta(txn, entry, base) or Body(entry.size, entry.hash, entry.chunks)
            txn.put(digest, body.to_bytes(), db=self._bodies)
            if body.base is not None:
                self._bump(txn, body.base, +1)
            self._chunks.add_refs(txn, body.own_chunks(), +1, now_ms)
        txn.put(digest, _REFS.pack(n + 1), db=self._refs)

    def _delta(self, txn: lmdb.Transaction, entry: FileEntry, base: bytes | None) -> Body | None:
        # One chunk (every small file: an agent's state) is a delta only when the base holds
        # that very chunk, which saves no byte over the whole body: not looked for.
        if base is None or len(entry.chunks) < 2:
            return None
        head = self.body(txn, base)
        whole = self.get(txn, base)
        if head is None or whole is None or head.depth + 1 > MAX_DEPTH:
            return None
        runs, own = diff(entry.chunks, whole.chunks)
        if len(entry.chunks) - len(own) < MIN_SHARED * len(entry.chunks):
            return None
        chain = head.chain_bytes + sum(n for _, n in own)
        if chain > MAX_CHAIN_BYTES:
            return None
        return Body(entry.size, entry.hash, own, base, tuple(runs), head.depth + 1, chain)

    def _bump(self, txn: lmdb.Transaction, digest: bytes, delta: int) -> None:
        txn.put(digest, _REFS.pack(self.refs(txn, digest) + delta), db=self._refs)

    def drop(self, txn: lmdb.Transaction, digest: bytes, now_ms: int) -> None:
        """One reference fewer; the last drops the entry, its chunks' references and its
        reference on its base (which may go in turn)."""
        while True:
            n = self.refs(txn, digest)
            if n > 1:
                txn.put(digest, _REFS.pack(n - 1), db=self._refs)
                return
            body = self.body(txn, digest)
            txn.delete(digest, db=self._refs)
            txn.delete(digest, db=self._bodies)
            if body is None:
                return
            self._chunks.add_refs(txn, body.own_chunks(), -1, now_ms)
            if body.base is None:
                return
            digest = body.base

    def set_refs(self, txn: lmdb.Transaction, digest: bytes, n: int, now_ms: int) -> None:
        """Repair: make the stored count `n` (dropping the entry, and what it holds, at 0)."""
        if n <= 0:
            self.drop(txn, digest, now_ms)
        else:
            txn.put(digest, _REFS.pack(n), db=self._refs)

    def all_refs(self, txn: lmdb.Transaction) -> Iterator[tuple[bytes, int]]:
        for key, raw in txn.cursor(db=self._refs):
            yield bytes(key), int(_REFS.unpack(bytes(raw))[0])

    def recount(
        self, txn: lmdb.Transaction, named: Counter[bytes]
    ) -> tuple[Counter[bytes], Counter[bytes]]:
        """From the manifests' references (`named`): every live entry's expected count
        (manifest names plus delta children) and the chunk references they hold."""
        expected: Counter[bytes] = Counter(named)
        chunks: Counter[bytes] = Counter()
        todo = list(named)
        seen: set[bytes] = set()
        while todo:
            digest = todo.pop()
            if digest in seen:
                continue
            seen.add(digest)
            body = self.body(txn, digest)
            if body is None:
                continue
            chunks.update(body.own_chunks())
            if body.base is not None:
                expected[body.base] += 1
                todo.append(body.base)
        return expected, chunks

    def released(self, txn: lmdb.Transaction, dropped: Counter[bytes]) -> Counter[bytes]:
        """Chunk references freed if these entry references (digest -> how many) went
        together, following entries that would go to their bases."""
        drops = Counter(dropped)
        gone: set[bytes] = set()
        changed = True
        while changed:
            changed = False
            for digest, n in list(drops.items()):
                if digest in gone or self.refs(txn, digest) > n:
                    continue
                gone.add(digest)
                changed = True
                body = self.body(txn, digest)
                if body is not None and body.base is not None:
                    drops[body.base] += 1
        freed: Counter[bytes] = Counter()
        for digest in gone:
            body = self.body(txn, digest)
            if body is not None:
                freed.update(body.own_chunks())
        return freed
