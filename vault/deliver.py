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

Batches are verified on the calling thread while a store thread writes the one before,
and each written stretch's write-back starts at once, so the final fsync waits only for
the tail; the file is durable, and exactly the entry's size, when this returns.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol

from .content.reader import CopyBuffers, Plain, Reader, batches
from .errors import InvalidRequest, Unavailable
from .files import start_writeback
from .ingest import handed_over_file
from .manifest import FileEntry

if TYPE_CHECKING:
    from .runtime import Runtime


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
    the entry's size and fsync it. `stop` set: stop before the next batch (503)."""
    handed_over_file(fd, writing=True)
    pos = 0
    writing: Future[int] | None = None
    copies = CopyBuffers()  # the batch read goes into one while the one before is written
    try:
        for cids in batches([(cid, n) for cid, _, n in entry.spans()]):
            if stop is not None and stop.is_set():
                raise Unavailable("the server is shutting down; restore the file again")
            batch = reader.copied(cids, copies) or reader.chunks(cids)
            if writing is not None:
                pos = writing.result()
            writing = store.runtime.store.submit(_write, fd, batch, pos)
        if writing is not None:
            pos = writing.result()
        _writing(os.ftruncate, fd, pos)
        _writing(os.fsync, fd)
    finally:
        if writing is not None:  # nothing of this file runs on behind an error
            writing.exception()
    if pos != entry.size:
        raise RuntimeError(f"wrote {pos} bytes of a {entry.size}-byte file")


def _write(fd: int, batch: list[Plain], pos: int) -> int:
    """Write `batch` at `pos` and start its write-back; the offset after it."""
    start = pos
    try:
        for part in batch:
            pos = _put(fd, part, pos)
    except OSError as e:
        raise _unwritable(e) from e
    start_writeback(fd, start, pos - start)
    return pos


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
