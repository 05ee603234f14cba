"""Shrinking the hot store: the pages LMDB freed go back to the file system.

LMDB never gives a page back: what compaction, GC or a demotion frees waits on its free
list for a later write, and the data file keeps its blocks, so `du` of a data dir did not
move when compaction saved 90% in the engine's own figures (issue 32). A shrink punches
holes (`fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)`) over the pages LMDB may
hand out again, and over what lies past the last page in use (pages of transactions a
recovery rolled back): their blocks are freed, the file keeps its size, inode and every
page in use, and LMDB, which writes a reused page whole before it reads it, never sees the
difference.

Why holes and not a compacting copy (`mdb_env_copy2` with `MDB_CP_COMPACT`) renamed over
`data.mdb`: measured on the same data dirs (bench/bench_du.py), the copy writes every live
byte again (the whole hot store, for a few pages freed: 0.44 s and 424 MB written against
0.09 s and nothing for the same 65 MB given back) while writes wait, where punching writes
nothing (the kernel drops the punched pages from the page cache, ~0.3 s per GB, so a
shrink goes in slices of SLICE_BYTES, each its own pause); and a copy is a new file, so
the durable state's inode, LMDB's reader table in `lock.mdb` and every other process
holding the environment open would have to follow it (a swap record for recovery, a reopen
in each worker). The cost of holes: the file's apparent size and LMDB's map stay what they
were, and free space stays fragmented for LMDB's page allocator. A file is never replaced
here, so readers in other processes need not reopen anything.

Safety. Each slice runs on the writer thread between batches with everything committed
durable and none of the syncer's pins held (`Writer.quiesced`, as map growth runs), so no
transaction writes meanwhile and the durable state is the newest committed one, L. A page
is punched only if the free list of L lists it as freed by a transaction T no newer than
the oldest snapshot any process still reads (LMDB's reader table: downloads, worker
processes), nor than L: a page freed by T is in no tree from T on. LMDB itself reuses a
page only once T is older than every reader and than L; the difference (pages freed by the
oldest reader's own transaction, or by L) is pages only snapshot T-1 holds, which nobody
reads and recovery never returns to: it writes the durable state's meta pages (L's) back
first (vault/syncer.py), so no fallback to meta page L-1 can happen. A SIGKILL or a
power loss at any step therefore leaves every page of the durable state as it was, at
worst a hole not yet punched (tests/fault/test_shrink_crash.py).

When. After compaction, GC (and repack) and a tiering run, `maintenance/tasks.py` shrinks
when the hot store's reclaimable bytes are more than `VaultConfig.shrink_above` (5%) of
the bytes it holds in use.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from checkpoint_vault.protocol import DiskSpace

from .env import DATA_FILE, Env
from .libc import punch_hole
from .pages import FreeList, PageFormatError, oldest_reader, read_free_list

if TYPE_CHECKING:
    from .env import Env
    from .writer import Writer


class ShrinkParts(Protocol):
    """What shrinking needs of the store: both environments and the writer to pause."""

    @property
    def catalog_env(self) -> Env: ...
    @property
    def frames_env(self) -> Env: ...
    @property
    def writer(self) -> Writer: ...


log = logging.getLogger(__name__)

# Bytes given back per pause of the writer. Punching costs ~0.3 s per GB here (the kernel
# drops those pages from the page cache), so one shrink after deleting a whole series
# (900 MB) held writes 0.3-1.1 s; a slice of 256 MiB holds them ~0.1 s.
SLICE_BYTES = 256 << 20


@dataclass(frozen=True)
class Space:
    """What an environment's data file takes on disk, and how much of that is not in use."""

    allocated: int  # bytes of blocks the file takes (st_blocks x 512: what `du` counts)
    free: int  # bytes of the pages on LMDB's free list (allocated or holes)
    # allocated bytes holding no page in use: free pages not yet punched, and what lies past
    # the last page; what a shrink gives back once no reader needs them
    reclaimable: int


@dataclass(frozen=True)
class ShrinkResult:
    """What one shrink gave back."""

    allocated_before: int  # bytes the hot store's files took on disk
    allocated_after: int
    pages: int  # pages punched that still held blocks (the tail's counted by page too)
    slices: int  # pauses of the writer it took (SLICE_BYTES each at most)
    seconds: float  # from start to end, writes going on between the slices

    @property
    def freed(self) -> int:
        return self.allocated_before - self.allocated_after


def space(env: Env) -> Space:
    """`env`'s data file on disk, from its free list (a short read transaction)."""
    fd = os.open(env.path / DATA_FILE, os.O_RDONLY)
    try:
        allocated = os.fstat(fd).st_blocks * 512
        try:
            with env.read():  # the map stays still while the file is read (growth)
                free = read_free_list(env.lmdb, fd)
        except PageFormatError:
            log.exception("reading LMDB's free list of %s failed", env.path.name)
            return Space(allocated, 0, 0)
    finally:
        os.close(fd)
    in_use = (free.last_page + 1 - free.free_pages) * free.psize
    return Space(allocated, free.free_pages * free.psize, max(0, allocated - in_use))


def hot_store(store: ShrinkParts) -> dict[str, DiskSpace]:
    """Each environment of the hot store on disk, by name ("catalog", "frames")."""
    out = {}
    for name, env in (("catalog", store.catalog_env), ("frames", store.frames_env)):
        s = space(env)
        out[name] = DiskSpace(s.allocated, s.free, s.reclaimable)
    return out


def worth_shrinking(store: ShrinkParts, above: float) -> bool:
    """Whether the hot store's reclaimable bytes are more than `above` of the bytes it holds
    in use (0: whenever any is). Of what it holds, not of what it takes: a fine-tune saved
    and compacted checkpoint by checkpoint frees ~48 MB per compaction, 9.9% of the 472 MB
    its files then take and 11% of the 425 MB in use, so a share of the files' size skipped
    every other shrink there (bench/bench_du.py)."""
    spaces = hot_store(store).values()
    reclaimable = sum(s.reclaimable_bytes for s in spaces)
    in_use = sum(s.allocated_bytes for s in spaces) - reclaimable
    return reclaimable > 0 and reclaimable > above * in_use


def shrink(store: ShrinkParts, slice_bytes: int = SLICE_BYTES) -> ShrinkResult:
    """Punch holes over every page of the hot store's environments no reader can see (the
    catalog's and the frames'), on the writer thread between batches, at most
    `slice_bytes` of them per pause: writes queued meanwhile go in between slices, and
    each slice reads the free list again (pages LMDB reused in between are no longer on
    it)."""
    envs = (store.catalog_env, store.frames_env)
    started = time.monotonic()
    before = sum(_allocated(e) for e in envs)
    pages = slices = 0
    after = before
    more = True
    while more:
        punched, more = store.writer.quiesced(lambda: _punch_slice(envs, slice_bytes))
        pages += punched
        slices += 1
        was, after = after, sum(_allocated(e) for e in envs)
        more = more and after < was  # a file system that punches nothing: stop, not loop
    return ShrinkResult(before, after, pages, slices, time.monotonic() - started)


def _allocated(env: Env) -> int:
    return (env.path / DATA_FILE).stat().st_blocks * 512


def _punch_slice(envs: tuple[Env, ...], budget: int) -> tuple[int, bool]:
    """Pages punched over `envs`, up to `budget` bytes, and whether some are left."""
    pages = 0
    for env in envs:
        punched, used = _punch_env(env, budget)
        pages += punched
        budget -= used
        if budget <= 0:
            return pages, True
    return pages, False


def _punch_env(env: Env, budget: int) -> tuple[int, int]:
    """Punch `env`'s reusable pages and its tail that still hold blocks, until `budget`
    bytes are punched; (pages, bytes) punched. Writer thread, quiesced: the newest
    committed state is durable and no transaction writes."""
    fd = os.open(env.path / DATA_FILE, os.O_RDWR)
    try:
        env.lmdb.reader_check()  # slots of dead processes would hold pages for nobody
        try:
            with env.read():
                free = read_free_list(env.lmdb, fd)
        except PageFormatError:
            log.exception("reading LMDB's free list of %s failed: not shrunk", env.path.name)
            return 0, 0
        psize = free.psize
        pages = _punchable(free, oldest_reader(env.lmdb))
        spans = [(first * psize, count * psize) for first, count in _runs(pages)]
        size = os.fstat(fd).st_size
        tail = (free.last_page + 1) * psize
        if size > tail:
            spans.append((tail, size - tail))
        punched = 0
        try:
            for offset, length in spans:
                if punched >= budget:
                    break
                start = _first_data(fd, offset, offset + length)
                if start is not None:
                    part = min(offset + length - start, budget - punched)  # the rest: later
                    _punch(fd, start, part)
                    punched += part
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            log.warning("%s: the file system cannot punch holes; not shrunk", env.path.name)
            return 0, 0
        return punched // psize, punched
    finally:
        os.close(fd)


def _first_data(fd: int, start: int, end: int) -> int | None:
    """Where the first allocated block of [start, end) is; None if it is all holes (punched
    before)."""
    try:
        found = os.lseek(fd, start, os.SEEK_DATA)
    except OSError as e:
        if e.errno == errno.ENXIO:  # no data from `start` to the end of the file
            return None
        raise
    return found if found < end else None


def _punchable(free: FreeList, oldest: int) -> list[int]:
    """Free pages no reader can see: freed by a transaction no newer than the oldest
    snapshot any reader holds (`oldest`: the newest committed one when nobody reads), since
    a page freed by T is in no tree from T on; never a meta page, nor one past the last."""
    limit = min(oldest, free.txnid) + 1
    return [p for p in free.reusable(limit) if 2 <= p <= free.last_page]


def _runs(pages: list[int]) -> Iterator[tuple[int, int]]:
    """(first page, count) of each run of consecutive pages in sorted `pages`."""
    start = prev = -2
    for p in pages:
        if p != prev + 1:
            if prev >= 0:
                yield start, prev - start + 1
            start = p
        prev = p
    if prev >= 0:
        yield start, prev - start + 1


def _punch(fd: int, offset: int, length: int) -> None:
    """fallocate(2) with its mode flags, which Python's os module does not offer."""
    punch_hole(fd, offset, length)
