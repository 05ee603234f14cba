"""Writing a stored file into a file a client on this machine handed over.

The mirror of `ingest_descriptor`: a client restoring from a server on its own machine
opens the file it restores into and hands the open descriptor over on the local socket
(client/local.py); the server writes the file's bytes into it. Over HTTP every byte is
copied into the socket, out of it and into the file, and hashed again by the client; here
a raw hot frame is copied out of the frame environment's data file into a buffer of this
process under a read transaction, verified there against its id, and written from that
buffer with `pwrite`. Chunks that are not raw hot frames (zstd, deltas, packed, in a
colder tier) are decoded and verified as for any read, then written.

Not sendfile from the data file, though that was one copy fewer (issue 41): it writes
into the handed-over file from the data file's page-cache pages, and whether those pages
are copied before the call returns depends on the file system the client chose. A FUSE
file opened for direct I/O takes them by reference into the request its daemon reads,
and a daemon reading with splice keeps references to them after it has answered, past
the end of the read transaction that kept LMDB from reusing them for another tenant's
data. A write from this process's memory is copied by every file system (FUSE copies
user pages into a request it hands out by reference); the buffer is only refilled after
the write has returned.

The client checks nothing it did not compute on this path: the server verified every
chunk against its id, and the entry's ordered chunk ids are what the file's hash was
proven against at its commit.

A large file on a local block file system (ext4, XFS, Btrfs) is written with direct I/O,
`O_DIRECT` set on the handed-over descriptor for the restore and its flags put back after:
writing a restored file through the page cache (a page allocated, filled and later written
back for every 4 KiB) cost more CPU than copying and hashing it, and the cores are what
bounds a restore here. It goes in windows of `WINDOW` bytes: `WORKERS` store threads each
copy and verify a window of their own into its buffer (preadv and BLAKE3 release the
interpreter lock; one thread doing every copy and hash was what bounded a restore), and
the calling thread writes the windows in file order as they are ready, one stream of
writes (two threads each writing their own windows were no faster). A chunk across a
window's edge is read and verified by both windows, each writing its own part. Windows
start at multiples of `ALIGN` in the file and in their buffers, so every write is
aligned; the last one is padded with zeros to a whole block and the file truncated to its
size after. A file restored this way is not left in the page cache: a reader right after
reads it from the disk.

Smaller files, other file systems, and one that refuses a direct write go through the
page cache: each batch copied and verified on the calling thread while a store thread
writes the one before and starts its write-back, so the final fsync waits only for the
tail. Either way the file is durable, and exactly the entry's size, when this returns;
after a failure nothing of it runs on.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from checkpoint_vault.protocol import direct_safe

from .content.reader import CopyBuffers, Plain, Reader, batches
from .errors import InvalidRequest, Unavailable
from .files import start_writeback
from .ingest import handed_over_file
from .manifest import FileEntry

if TYPE_CHECKING:
    from .runtime import Runtime

# Windows copied and verified at once, each on a store thread (4 of them; two files
# restored at once take them all). Two: one core's share of copying and hashing each, on
# the 2-core development machine.
WORKERS = 2
ALIGN = 4096  # direct writes: file offsets, lengths and buffer addresses in these units
WINDOW = 8 << 20  # bytes of the file per window, a multiple of ALIGN; a chunk across an
# edge is read twice, so a 256 KiB chunk costs 3% more reading at 8 MiB
DIRECT_MIN = 32 << 20  # smaller files go through the page cache (a window or a few)


class DeliverParts(Protocol):
    """What a delivery needs of the store: the runtime's store threads."""

    @property
    def runtime(self) -> Runtime: ...


def deliver_descriptor(
    store: DeliverParts,
    reader: Reader,
    entry: FileEntry,
    fd: int,
    stop: threading.Event | None = None,
) -> None:
    """Write the file `entry` into the open file `fd`, from offset 0, then truncate it to
    the entry's size and fsync it. `stop` set: stop before the next window (503)."""
    handed_over_file(fd, writing=True)
    if sum(n for _, n in entry.chunks) != entry.size:
        raise RuntimeError(f"the chunks of a {entry.size}-byte file add up to another size")
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    direct = _direct_fits(fd, entry.size) and _set_flags(fd, flags | os.O_DIRECT)
    try:
        if not (direct and _written_directly(store, reader, entry, fd, stop)):
            if direct:  # refused: every window has stopped; write it again, through the cache
                direct = not _set_flags(fd, flags)
            _through_cache(store, reader, entry, fd, stop)
        _writing(os.ftruncate, fd, entry.size)
        _writing(os.fsync, fd)
    finally:
        if direct:  # the descriptor is the client's too: its flags as they were
            _set_flags(fd, flags)


def _written_directly(
    store: DeliverParts,
    reader: Reader,
    entry: FileEntry,
    fd: int,
    stop: threading.Event | None,
) -> bool:
    """The file written with direct I/O: windows copied and verified by WORKERS store
    threads, written in file order here (one stream of writes: two threads each writing
    their own windows were no faster). False if the file system refused a direct write."""
    rooms = [_Room() for _ in range(WORKERS + 1)]  # WORKERS filling, one being written
    copying: deque[tuple[_Window, memoryview, Future[None]]] = deque()
    try:
        for i, window in enumerate(_windows(entry)):
            if stop is not None and stop.is_set():
                raise Unavailable("the server is shutting down; restore the file again")
            buf = _buffer(window, rooms[i % len(rooms)])
            copying.append((window, buf, store.runtime.store.submit(_copy, reader, window, buf)))
            if len(copying) > WORKERS:
                _write(fd, *copying.popleft())
        while copying:
            _write(fd, *copying.popleft())
    except _NoDirect:
        return False
    finally:
        for _, _, left in copying:  # nothing of this file runs on behind an error
            left.exception()
    return True


def _through_cache(
    store: DeliverParts,
    reader: Reader,
    entry: FileEntry,
    fd: int,
    stop: threading.Event | None,
) -> None:
    """The file written through the page cache: each batch copied and verified here while
    a store thread writes the one before and starts its write-back. (The windows of the
    direct path, written this way, took 4.4 s for 1 GiB against this loop's 1.8 s, same
    run: the page cache's writes want the CPU a second copying thread takes.)"""
    pos = 0
    writing: Future[int] | None = None
    copies = CopyBuffers()  # the batch read goes into one while the one before is written
    try:
        for cids in batches(entry.chunks):
            if stop is not None and stop.is_set():
                raise Unavailable("the server is shutting down; restore the file again")
            batch = reader.copied(cids, copies) or reader.chunks(cids)
            if writing is not None:
                pos = writing.result()
            writing = store.runtime.store.submit(_write_batch, fd, batch, pos)
        if writing is not None:
            pos = writing.result()
    finally:
        if writing is not None:  # nothing of this file runs on behind an error
            writing.exception()
    if pos != entry.size:
        raise RuntimeError(f"wrote {pos} bytes of a {entry.size}-byte file")


def _write_batch(fd: int, batch: list[Plain], pos: int) -> int:
    """Write `batch` at `pos` and start its write-back; the offset after it."""
    start = pos
    try:
        for part in batch:
            pos = _put(fd, part, pos)
    except OSError as e:
        raise _unwritable(e) from e
    start_writeback(fd, start, pos - start)
    return pos


@dataclass(frozen=True)
class _Window:
    """File bytes [start, end) and the chunks that hold them, the first beginning at
    `first` (before `start` when it crosses the window's edge)."""

    start: int
    end: int
    first: int
    cids: list[bytes]
    sizes: list[int]


def _windows(entry: FileEntry) -> Iterator[_Window]:
    spans = [(cid, at, n) for cid, at, n in entry.spans() if n]
    j = 0
    for start in range(0, entry.size, WINDOW):
        end = min(start + WINDOW, entry.size)
        while spans[j][1] + spans[j][2] <= start:
            j += 1
        k = j
        while k < len(spans) and spans[k][1] < end:
            k += 1
        held = spans[j:k]
        yield _Window(start, end, held[0][1], [c for c, _, _ in held], [n for _, _, n in held])


class _Room:
    """One worker's buffer, page-aligned (an anonymous map) as direct writes need, grown
    to the largest window it has held."""

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, ALIGN)

    def __call__(self, size: int) -> memoryview:
        if len(self._map) < size:
            self._map = mmap.mmap(-1, size)
        return memoryview(self._map)


class _NoDirect(Exception):
    """The file system refused a direct write (EINVAL: not supported, or a larger block
    size than ALIGN)."""


def _buffer(w: _Window, room: _Room) -> memoryview:
    """Room for window `w`: its first chunk's bytes before the window's start, then the
    window from a block boundary, a block to spare (the last window's padding)."""
    before = w.start - w.first  # bytes of the first chunk before the window
    lead = -(-before // ALIGN) * ALIGN
    return room(lead - before + sum(w.sizes) + ALIGN)[lead - before :]


def _copy(reader: Reader, w: _Window, buf: memoryview) -> None:
    """Copy and verify the chunks of window `w` into `buf`."""
    reader.copy_into(w.cids, w.sizes, buf[: sum(w.sizes)])


def _write(fd: int, w: _Window, buf: memoryview, copied: Future[None]) -> None:
    """Once copied, write window `w`'s bytes at their place in the file, directly: from a
    block boundary in memory, padded with zeros to a whole block."""
    copied.result()
    window = buf[w.start - w.first :]  # on a block boundary in memory
    length = w.end - w.start
    padded = -(-length // ALIGN) * ALIGN  # only the file's last window is not whole
    window[length:padded] = bytes(padded - length)
    try:
        _put(fd, window[:padded], w.start)
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise _NoDirect from e
        raise _unwritable(e) from e


def _direct_fits(fd: int, size: int) -> bool:
    """Whether to write the file with direct I/O: large enough, and on a local block file
    system. Not elsewhere: a FUSE daemon reading with splice may keep references to the
    buffer's pages past the write, and read them once the buffer holds the next window's
    copies, not all of them verified yet."""
    return size >= DIRECT_MIN and direct_safe(fd)


def _set_flags(fd: int, flags: int) -> bool:
    """Set the descriptor's status flags; False if refused (O_DIRECT where the file
    system has no direct I/O)."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    except OSError:
        return False
    return True


def _writing(fn: Callable[..., None], *args: int) -> None:
    try:
        fn(*args)
    except OSError as e:
        raise _unwritable(e) from e


def _unwritable(e: OSError) -> InvalidRequest:
    """The client's file refused the bytes (its disk full, its size limit): its problem
    to fix, told as such, and not retried as a server fault would be."""
    return InvalidRequest(f"cannot write the file handed over: {e.strerror or e}")


def _put(fd: int, data: Plain, pos: int) -> int:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, pos)
        view = view[n:]
        pos += n
    return pos
