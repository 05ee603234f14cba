"""The save journal: one-request saves acknowledged by one sequential append and sync.

A one-request save (vault/direct.py) is committed to LMDB like every change, but the sync
that makes a catalog commit durable writes every page the commit dirtied: ~25 pages of a
dozen tables, scattered over the file, ~0.4-0.8 ms of disk for a few kB of agent state.
So the writer also appends a record of the save (its header, the id and time it was
given, its files' chunk lists and the frames its transaction stored: vault/direct.py) to
this journal and syncs that: one sequential write, ~0.1 ms. The save is
acknowledged then; the LMDB state follows on the syncer's next cycle (vault/syncer.py),
which records in its durable slot the newest journal record that state contains.

Recovery: LMDB returns to its durable state, then every record after the one that state
contains is applied again, in order, as the same save (same id, time and parent), before
the vault serves. Records a durable state contains are deleted with their file.

Why a record can always be applied again: the writer journals a batch only if every
operation in it is a one-request save and every earlier batch that is not is durable
(`Writer`), so the state a record is applied on is exactly the one it first was (the
durable state plus the records before it), up to what no acknowledged change depends on.
So the chunks a record does not hold, stored and sound in that state, are there again.

Files: `journal/<first seq, 16 hex>.log`, a new one past `FILE_BYTES`. The one being
written is allocated ahead in steps of zeros (`ALLOC_STEP`; `AHEAD` by the syncer while
saves stream in) and written over in place: it starts again at its beginning whenever a
durable state holds all of it. A sync that must
also record a grown file (its size, its new blocks) commits the file system's own
journal too; one that only overwrites allocated blocks writes the data: 0.11 ms against
0.18-0.28 ms per append and sync here, what every save's acknowledgement waits for.
A record is `magic, seq, length, digest, payload`. Reading a file stops at the first
record that is torn, does not verify, or does not follow the one before it (seq + 1):
the zeros ahead, a write the crash cut short (never acknowledged), or the records of an
earlier round of the file, which are all older than any record written over them, so
they never follow on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import blake3

from .files import fsync_dir
from .ownership import open_private

log = logging.getLogger(__name__)

JOURNAL_DIR = "journal"  # in the vault dir, beside catalog/, frames/ and durable
FILE_BYTES = 16 << 20  # a file past this is closed; it goes once a durable state covers it
# Zeros written ahead of the records, so their syncs change no file size. An idle vault
# keeps this much (more after a burst, until SHRINK_ABOVE gives it back).
ALLOC_STEP = 64 << 10
SHRINK_ABOVE = 4 * ALLOC_STEP
# While saves stream in, the file is never written from its start again (a durable state
# never holds the newest records): the syncer keeps this much zeros ahead of the records
# (`trim`), so that an append's sync is of allocated blocks, not one that grows the file
# every ALLOC_STEP (at 30 kB records, every other save paid the file system's commit).
AHEAD = 8 * ALLOC_STEP
# A record's magic names its payload's generation: CVJ1, a save's whole files (read, no
# longer written); CVJ2, its chunk lists and stored frames (vault/direct.py). A version
# that knows only CVJ1 stops at a CVJ2 record as at a torn one rather than apply it wrong.
_MAGIC = b"CVJ2"
_KNOWN = (b"CVJ1", _MAGIC)
_HEAD = struct.Struct("<4sQI16s")  # magic, seq, payload length, digest of seq + payload
_SUFFIX = ".log"


def discard_journal(path: Path) -> None:
    """Remove a journal whose records belong to no state of the files beside it: opened
    with a new durable file (a new data dir; restores delete the durable file)."""
    shutil.rmtree(path, ignore_errors=True)


def _write_at(fd: int, data: bytes, offset: int) -> None:
    """All of `data` at `offset` (pwrite may write less than asked)."""
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def _digest(seq: int, payload: bytes) -> bytes:
    return blake3.blake3(struct.pack("<Q", seq) + payload).digest()[:16]


class Journal:
    """Append (writer thread), trim (syncer thread), read at open. `applied` is the seq of
    the newest record whose change the committed LMDB state holds: what a durable state
    captured now contains."""

    def __init__(self, path: Path, applied: int) -> None:
        self.path = path
        if not path.is_dir():
            path.mkdir(mode=0o700)
            fsync_dir(path.parent)  # else a power loss could take the directory, records and all
        self.applied = applied
        self._lock = threading.Lock()  # the file list: appends rotate, trims delete
        self._files = sorted(
            f for f in path.glob(f"*{_SUFFIX}") if len(f.stem) == 16 and _is_hex(f.stem)
        )
        self._last = max((seq for seq, _ in self._records()), default=applied)
        self._fd: int | None = None  # the file being written (opened at the next append)
        self._tail = 0  # where its next record goes
        self._allocated = 0  # its size: records, then zeros or an earlier round's records

    @property
    def last(self) -> int:
        """The newest record's seq (or `applied`, with no record after it)."""
        return self._last

    def pending(self) -> Iterator[tuple[int, bytes]]:
        """(seq, payload) of every intact record after `applied`, in order."""
        for seq, payload in self._records():
            if seq > self.applied:
                yield seq, payload

    def append(self, payloads: list[bytes]) -> int:
        """Write the records and sync them; returns the last one's seq."""
        parts = []
        seq = self._last
        for payload in payloads:
            seq += 1
            parts.append(_HEAD.pack(_MAGIC, seq, len(payload), _digest(seq, payload)))
            parts.append(payload)
        data = b"".join(parts)
        with self._lock:
            fd = self._writable(self._last + 1, len(data))
            end = self._tail + len(data)
            try:
                if end > self._allocated:
                    grown = -(-end // ALLOC_STEP) * ALLOC_STEP
                    _write_at(fd, bytes(grown - self._allocated), self._allocated)
                    self._allocated = grown
                _write_at(fd, data, self._tail)
                os.fdatasync(fd)
            except OSError:
                # Not acknowledged, so it must not come back at the next open either.
                with contextlib.suppress(OSError):
                    _write_at(fd, bytes(len(data)), self._tail)
                    os.fdatasync(fd)
                raise
            self._tail = end
            self._last = seq
        return seq

    def trim(self, durable: int) -> None:
        """Delete the files whose every record a durable state contains (syncer thread)."""
        with self._lock:
            keep_from = 0
            for i in range(len(self._files)):
                nxt = self._files[i + 1] if i + 1 < len(self._files) else None
                # A file's records run up to the next file's first seq (the newest: to `last`).
                end = int(nxt.stem, 16) - 1 if nxt is not None else self._last
                if end > durable or (nxt is None and self._fd is not None):
                    break
                keep_from = i + 1
            gone, self._files = self._files[:keep_from], self._files[keep_from:]
            if self._fd is not None and self._tail and durable >= self._last:
                # Every record is in the catalog: the file being written starts over, its
                # blocks kept (a burst's beyond SHRINK_ABOVE given back).
                self._tail = 0
                if self._allocated > SHRINK_ABOVE:
                    os.ftruncate(self._fd, ALLOC_STEP)
                    self._allocated = ALLOC_STEP
        for f in gone:
            f.unlink(missing_ok=True)
        self._zeros_ahead()

    def _zeros_ahead(self) -> None:
        """While records stream in: allocate `AHEAD` past them, synced, once they are
        within AHEAD / 2 of the end (an append waits for it meanwhile). A failure is
        only logged: the appends then grow the file themselves, as they can."""
        with self._lock:
            fd, end = self._fd, min(-(-(self._tail + AHEAD) // ALLOC_STEP) * ALLOC_STEP, FILE_BYTES)
            if fd is None or self._tail == 0 or self._allocated - self._tail >= AHEAD // 2:
                return
            if end > self._allocated:
                try:
                    _write_at(fd, bytes(end - self._allocated), self._allocated)
                    os.fdatasync(fd)
                except OSError as e:
                    log.warning("allocating the save journal ahead failed: %s", e)
                    return
                self._allocated = end

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _writable(self, seq: int, n: int) -> int:
        """The fd to write `n` bytes of records to, starting a new file at `seq` when there
        is none or they would take the current one past FILE_BYTES (lock held)."""
        if self._fd is not None and (self._tail == 0 or self._tail + n <= FILE_BYTES):
            return self._fd
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None  # a failed open below must not leave a closed number here
        path = self.path / f"{seq:016x}{_SUFFIX}"
        # A file of that name holds no intact record (else `last` would be past `seq`):
        # a torn first record of an earlier run. Emptied, so nothing precedes ours.
        self._fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        self._tail = self._allocated = 0
        if path not in self._files:
            self._files.append(path)
        fsync_dir(self.path)  # the file's entry must outlast a crash as its records do
        return self._fd

    def _records(self) -> Iterator[tuple[int, bytes]]:
        for f in list(self._files):
            data = f.read_bytes()
            pos, last = 0, None
            while pos + _HEAD.size <= len(data):
                magic, seq, n, digest = _HEAD.unpack_from(data, pos)
                if magic not in _KNOWN or (last is not None and seq != last + 1):
                    break  # zeros ahead, or an earlier round's records: the end
                payload = data[pos + _HEAD.size : pos + _HEAD.size + n]
                if len(payload) != n or _digest(seq, payload) != digest:
                    log.warning("journal %s ends in a torn record (seq %d)", f, seq)
                    break
                yield seq, payload
                pos, last = pos + _HEAD.size + n, seq
