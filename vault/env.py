"""LMDB environments: the catalog, and the hot tier's chunk frames.

Two environments, because they are shaped differently. Frames are large and written once;
keyed by an increasing sequence number they are pure appends, so a write batch touches the
rightmost leaf and nothing else. Catalog records (chunk metadata keyed by random chunk ids,
checkpoints, manifests) are small and updated in place; in their own file they stay compact,
instead of having their B-tree leaves scattered between gigabytes of frames, where every
random insert maps another page-cache folio into the server's memory. The price is ordering
across two files, which the writer thread owns (docs/DESIGN.md, "Crash ordering").

The map grows instead of failing: LMDB needs every transaction of the process closed while
the map is resized, so readers hold a shared lock for the life of their transaction and the
writer thread takes it exclusively to grow the map.
"""

from __future__ import annotations

import fcntl
import os
import stat
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO

import lmdb

from .errors import VaultInUse
from .libc import madvise_dontneed
from .ownership import check_entry, make_private, open_private

DATA_FILE = "data.mdb"  # LMDB's file in an environment's directory
LOCK_FILE = "lock.mdb"  # and its reader table
FRAME_DBS = (b"frames",)  # sequence number (u64 big endian) -> frame
CATALOG_DBS = (
    b"chunkmeta",  # chunk id -> ChunkMeta (refs, sizes, timestamps, flags, frame sequence)
    b"inline",  # chunk id -> frame: inline chunks stored before `inline_frames` (seq 0)
    b"packed",  # chunk id -> location in a tier's pack (ChunkMeta.seq == PACKED)
    b"deltas",  # chunk id -> id of the base chunk its delta frame is encoded against
    b"bases",  # base chunk id + dependent chunk id -> b"" (what keeps a base alive)
    b"compacted",  # checkpoint id -> id of the newer checkpoint it was compacted against
    b"checkpoints",  # checkpoint id -> record JSON (or tombstone)
    b"manifests",  # checkpoint id -> binary manifest (entry digests, or whole entries)
    b"entries",  # BLAKE3 of a file entry -> the entry (size, hash, chunk list)
    b"entryrefs",  # BLAKE3 of a file entry -> u32 references (file names of live manifests)
    b"nsindex",  # namespace \0 checkpoint id -> b"" (live checkpoints only)
    b"tagindex",  # namespace \0 BLAKE3-128(tag) checkpoint id -> b"" (live checkpoints only)
    b"namespaces",  # namespace -> namespace JSON
    b"uploads",  # upload id -> session JSON
    b"uploadfiles",  # upload id \0 file name -> FileEntry bytes
    b"idempotency",  # idempotency key of a one-request save -> namespace, checkpoint, expiry
    b"tokens",  # key id -> token JSON (hash of the secret, scopes)
    b"policies",  # namespace (or NUL "default") -> policy JSON
    b"counters",  # name -> signed 64-bit total
    b"nsrefs",  # chunk id + namespace -> u32 live checkpoints of it referencing the chunk
    b"uploadchunks",  # upload id \0 chunk id -> b"": chunks this session sent (dedup domains)
    b"audit",  # time (ms, u64 BE) + sequence (u32) -> audit entry JSON (vault/audit.py)
    b"keys",  # encryption key id (2 bytes, big endian) -> check value of that key
    b"inline_frames",  # sequence number (u64 BE) -> frame, for chunks of one-request saves
    b"samples",  # time (ms, u64 BE) -> storage sample JSON (vault/samples.py)
    b"auditby",  # token name \0 audit key -> b"": each token's entries (vault/audit.py)
    b"prepared",  # namespace \0 upload id -> transaction id: prepared uploads (vault/txn.py)
    b"pending",  # checkpoint id -> JSON: a commit of parts not adopted yet (vault/pending.py)
    # new tables go last: replication logs name a table by its place in this list
)
MIN_MAP_SIZE = 1 << 20
MAX_GROWTH_STEP = 64 << 30
TRIM_EVERY_BYTES = 8 << 20


def _mapped_range(path: Path) -> tuple[int, int] | None:
    """Where this process maps the file at `path` (Linux; else None)."""
    if not sys.platform.startswith("linux"):
        return None
    target = str(path.resolve())
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() == target:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                return start, end
    return None


def _madvise_dontneed(span: tuple[int, int]) -> None:
    """Unmap this process's resident pages in `span` (a range `_mapped_range` found).

    Reads go through LMDB's shared, read-only memory map, so every byte streamed out stays
    counted in the server's RSS until the kernel reclaims it. Dropping the mapping (not the
    page cache: the data stays cached) keeps RSS proportional to work in flight, not to
    bytes served; a later access just refaults the page from the cache.
    """
    start, end = span
    madvise_dontneed(start, end - start)


def _lock_dir(path: Path) -> IO[bytes]:
    """Hold an exclusive lock on the data dir for the life of the process.

    LMDB itself would let a second process open the same files, but the writer thread, the
    id generator and the token cache each assume they are the only ones; the kernel drops
    the lock when the process dies, so a SIGKILLed server never blocks its successor.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    owner = os.fdopen(open_private(path / "vault.lock", flags), "ab")
    try:
        fcntl.flock(owner.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner.close()
        raise VaultInUse(f"{path} is in use by another vault process") from None
    return owner


class _SharedExclusiveLock:
    """Many readers or one resizer; a waiting resizer stops new readers (no starvation)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._exclusive_waiting = 0
        self._exclusive = False

    @property
    def readers(self) -> int:
        return self._readers

    @contextmanager
    def shared(self) -> Iterator[None]:
        self.take_shared()
        try:
            yield
        finally:
            self.drop_shared()

    def take_shared(self) -> None:
        with self._cond:
            while self._exclusive or self._exclusive_waiting:
                self._cond.wait()
            self._readers += 1

    def drop_shared(self) -> None:
        with self._cond:
            self._readers -= 1
            if not self._readers:
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._exclusive_waiting += 1
            while self._readers or self._exclusive:
                self._cond.wait()
            self._exclusive_waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


class Env:
    """Owns the lmdb.Environment, its named databases and the resize protocol."""

    def __init__(
        self,
        path: Path,
        map_size: int = 1 << 30,
        names: tuple[bytes, ...] = CATALOG_DBS,
        synced: bool = True,
        prepare: Callable[[], None] | None = None,
        *,
        reader: bool = False,
    ) -> None:
        """`synced=False`: commits do not sync (MDB_NOSYNC); only for environments whose
        durability a `Syncer` provides (vault/syncer.py). `prepare` runs once the directory
        is locked, before LMDB opens it (the syncer's recovery).

        `reader`: opened beside the process that writes (a worker of `ckpt serve
        --workers`): no lock on the directory (the writing process holds it), nothing
        written, and a map the writer grew is adopted at the next read (LMDB answers
        MDB_MAP_RESIZED once the data passed this process's map)."""
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        check_entry(path, stat.S_IFDIR)
        self.path = path
        self.reader = reader
        self._owner: IO[bytes] | None = None if reader else _lock_dir(path)
        data_file = path / DATA_FILE
        try:
            if prepare is not None:
                prepare()
            for name in (DATA_FILE, LOCK_FILE):  # LMDB opens them by path, following links
                check_entry(path / name, stat.S_IFREG)
            existing = data_file.stat().st_size if data_file.exists() else 0
            self.lmdb = lmdb.open(
                str(path),
                map_size=max(map_size, MIN_MAP_SIZE, existing * 2),
                max_dbs=len(names) + 2,
                max_readers=512,
                readahead=False,  # random chunk reads; readahead only pollutes the page cache
                mode=0o600,
                sync=synced,
                metasync=synced,
                readonly=reader,
            )
        except BaseException:
            if self._owner is not None:
                self._owner.close()
            raise
        if not reader:
            make_private(path)
        self.db = {name.decode(): self.lmdb.open_db(name, create=not reader) for name in names}
        self._lock = _SharedExclusiveLock()
        self._data_file = data_file
        self._read_since_trim = 0
        self._span: tuple[int, int] | None = None  # the map's address range, once looked up

    def read(self) -> _Reading:
        """A read transaction; keep it short, it blocks map growth while open."""
        return _Reading(self)

    def _begin_read(self) -> lmdb.Transaction:
        """`read`'s transaction, the shared side of the resize lock taken with it."""
        lock = self._lock
        while True:
            lock.take_shared()
            try:
                return self.lmdb.begin(buffers=True)
            except lmdb.MapResizedError:
                lock.drop_shared()  # the writing process grew the map: adopt its size
            except BaseException:
                lock.drop_shared()
                raise
            self._adopt_map()

    def _end_read(self, txn: lmdb.Transaction) -> None:
        try:
            txn.abort()
        finally:
            self._lock.drop_shared()

    def _adopt_map(self) -> None:
        """Take the map size another process set (LMDB needs no transaction of this process
        open meanwhile, which the exclusive side of the resize lock gives)."""
        with self._lock.exclusive():
            self.lmdb.set_mapsize(0)
            self._span = None

    @property
    def readers(self) -> int:
        """Read transactions open now (pinned downloads among them)."""
        return self._lock.readers

    def map_span(self) -> tuple[int, int] | None:
        """Where this process maps the data file (None where that cannot be known); looked
        up once per mapping (call with a reader's share of the lock held: growth remaps)."""
        if self._span is None:
            self._span = _mapped_range(self._data_file)
        return self._span

    def pin(self) -> Pin:
        """A read transaction the caller ends with `Pin.release()`, for bytes copied out of
        the data file by offset (`Reader.copied`): while it lives, no page it can see is
        reused. Once it ends those pages may hold another tenant's data, so nothing may
        read them later: never hand them to a socket or a pipe by reference (sendfile,
        splice), which reads them when the bytes leave (issue 41). It blocks map growth
        like any reader: release it soon."""
        return Pin(self)

    def note_io(self, nbytes: int) -> None:
        """Count bytes moved through the environment (read or written; LMDB leaves pages it
        touched mapped in either case); past TRIM_EVERY_BYTES, drop the mapping."""
        self._read_since_trim += nbytes  # racy by design: an approximate trigger is enough
        if self._read_since_trim >= TRIM_EVERY_BYTES:
            self._read_since_trim = 0
            with self._lock.shared():  # the map cannot move while we advise on it
                span = self.map_span()
                if span is not None:
                    _madvise_dontneed(span)

    def grow(self) -> int:
        """Enlarge the map (called by the writer thread with no write txn open)."""
        with self._lock.exclusive():
            current = int(self.lmdb.info()["map_size"])
            new = current + min(current, MAX_GROWTH_STEP)
            self.lmdb.set_mapsize(new)
            self._span = None  # remapped: look it up again
            return new

    def map_size(self) -> int:
        return int(self.lmdb.info()["map_size"])

    def copy_to(self, fd: int) -> None:
        """A consistent, compacted copy of the whole environment into `fd` (LMDB copies from
        one read snapshot; the resize lock keeps the map still meanwhile)."""
        with self._lock.shared():
            self.lmdb.copyfd(fd, compact=True)

    def used_bytes(self) -> int:
        """Bytes of the map in use (pages up to the last one written)."""
        info = self.lmdb.info()
        return (int(info["last_pgno"]) + 1) * int(self.lmdb.stat()["psize"])

    def close(self) -> None:
        with self._lock.exclusive():
            self.lmdb.close()
        if self._owner is not None:
            self._owner.close()

    def scan(self, db_name: str, batch: int = 10_000) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) of a database, read in short transactions of `batch` items.

        Not a snapshot: entries written during the scan may or may not appear. Callers that
        act on what they see re-check it inside the writer transaction.
        """
        db = self.db[db_name]
        last: bytes | None = None
        while True:
            items: list[tuple[bytes, bytes]] = []
            with self.read() as txn:
                cur = txn.cursor(db=db)
                ok = cur.set_range(last) if last is not None else cur.first()
                while ok and len(items) < batch:
                    key = bytes(cur.key())
                    if key != last:
                        items.append((key, bytes(cur.value())))
                    ok = cur.next()
            yield from items
            if len(items) < batch:
                return
            last = items[-1][0]


class Pin:
    """An open read transaction plus what copying out of the file by offset needs: the
    data file, open for reading, and where the map lies (a value's file offset is its
    address in the map minus the map's start)."""

    def __init__(self, env: Env) -> None:
        self._stack = ExitStack()
        self.txn = self._stack.enter_context(env.read())
        try:
            span = env.map_span()
            if span is None:
                raise OSError("the map of the data file is not in /proc/self/maps")
            self._map_start = span[0]
            self.file = self._stack.enter_context(open(env._data_file, "rb"))  # noqa: SIM115
        except BaseException:
            self._stack.close()
            raise

    def offset(self, value: memoryview) -> int:
        """Where in the data file `value` (read through `txn`) starts."""
        import numpy as np  # the server's own dependency; only pinned readers need it

        address = int(np.frombuffer(value, dtype=np.uint8).ctypes.data)
        return address - self._map_start

    def release(self) -> None:
        self._stack.close()


class _Reading:
    """`Env.read` as a plain context manager: a save's preparation opens about six read
    transactions and a request's authentication one more, and the generator-based
    `contextmanager` (two of them nested, lock and transaction) cost ~3 µs of each
    ~3.5 µs of an open-get-close; this does the same in ~1.5."""

    __slots__ = ("_env", "_txn")

    def __init__(self, env: Env) -> None:
        self._env = env

    def __enter__(self) -> lmdb.Transaction:
        self._txn = self._env._begin_read()  # noqa: SLF001 - Env's own helper
        return self._txn

    def __exit__(self, *exc: object) -> None:
        self._env._end_read(self._txn)  # noqa: SLF001
