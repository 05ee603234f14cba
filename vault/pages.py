"""LMDB's free list, read from an environment's data file: which pages are free, and which of
those LMDB itself may hand out again now (what a shrink may give back to the file system).

py-lmdb exposes no handle on LMDB's free-page database (dbi 0), so this reads it the way
`mdb_stat -ff` does, from the file: the newest meta page names the free database's root,
whose leaves map the id of the transaction that freed pages to the list of those pages
(an IDL: a count, then page numbers). Only the layout of LMDB 0.9 on a 64-bit machine is
read (the version py-lmdb bundles); anything else raises `PageFormatError` and callers
leave the file alone.

Which free pages are reusable follows LMDB's own rule (`mdb_page_alloc`): pages freed by
transaction T may be overwritten once every reader's snapshot, and the newest committed
transaction, are past T (`T < oldest`); a reader of an older snapshot may still see them.
Readers of every process count (LMDB's reader table in `lock.mdb`), so worker processes
reading the environment keep their pages as they keep them from LMDB. The syncer's pins
are readers too, so the durable state's pages are never among them (vault/syncer.py).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import lmdb

_PAGE_HEAD = struct.Struct("<QHHHH")  # pgno, pad, flags, lower, upper (pages: lower+upper)
_OVERFLOW_PAGES = struct.Struct("<I")  # at offset 12 of an overflow page: its page count
_NODE = struct.Struct("<HHHH")  # lo, hi, flags, key size
_U64 = struct.Struct("<Q")
_META_MAGIC = 0xBEEFC0DE
_META = 16  # the meta starts after the page header
_FREE_ROOT = _META + 24 + 40  # the free database's md_root (mm_dbs[0].md_root)
_LAST_PAGE = _META + 120  # mm_last_pg
_TXNID = _META + 128  # mm_txnid
_P_BRANCH, _P_LEAF, _P_OVERFLOW = 0x01, 0x02, 0x04
_F_BIGDATA = 0x01
_NO_PAGE = (1 << 64) - 1  # P_INVALID: an empty tree's root


class PageFormatError(Exception):
    """The file is not laid out as this module reads it (another LMDB version or word
    size, or a page changed under the reader): nothing may be concluded from it."""


@dataclass(frozen=True)
class FreeList:
    """One snapshot of an environment's free list."""

    psize: int
    txnid: int  # the snapshot's transaction
    last_page: int  # the highest page in use
    # transaction that freed them -> page numbers
    freed: dict[int, list[int]]
    own_pages: int  # pages of the free database itself (branch, leaf, overflow)

    @property
    def free_pages(self) -> int:
        return sum(len(p) for p in self.freed.values())

    def reusable(self, oldest: int) -> list[int]:
        """Pages LMDB may overwrite now, sorted, given `oldest`: the lowest snapshot any
        reader holds (or the newest transaction, when none is older)."""
        return sorted(p for txn, pages in self.freed.items() if txn < oldest for p in pages)


def read_free_list(env: lmdb.Environment, fd: int) -> FreeList:
    """The free list of the snapshot a read transaction sees now, read from `fd` (the data
    file). The transaction stays open while the pages are read, so none of them is
    reused meanwhile; a commit that overwrote its meta page first is retried."""
    psize = int(env.stat()["psize"])
    for _ in range(8):
        with env.begin() as txn:
            meta = _meta_of(fd, psize, int(txn.id()))
            if meta is not None:
                last_page, root = meta
                own = [0]
                freed = dict(_free_entries(fd, psize, root, own)) if root != _NO_PAGE else {}
                return FreeList(psize, int(txn.id()), last_page, freed, own[0])
    raise PageFormatError("no meta page matched the read snapshot (commits kept coming)")


def oldest_reader(env: lmdb.Environment) -> int:
    """The lowest transaction id any reader of any process holds, or the newest committed
    one: pages freed at or after it are still visible to someone."""
    oldest = int(env.info()["last_txnid"])
    for line in env.readers().splitlines()[1:]:
        fields = line.split()
        if len(fields) == 3 and fields[2].isdigit():
            oldest = min(oldest, int(fields[2]))
    return oldest


def _meta_of(fd: int, psize: int, txnid: int) -> tuple[int, int] | None:
    """(last page, free database root) of the meta page holding `txnid`, if still there."""
    for index in (0, 1):
        page = os.pread(fd, psize, index * psize)
        if len(page) < _TXNID + 8 or struct.unpack_from("<I", page, _META)[0] != _META_MAGIC:
            raise PageFormatError("meta page without LMDB's magic")
        if _U64.unpack_from(page, _TXNID)[0] == txnid:
            return _U64.unpack_from(page, _LAST_PAGE)[0], _U64.unpack_from(page, _FREE_ROOT)[0]
    return None


def _free_entries(
    fd: int, psize: int, root: int, own: list[int]
) -> Iterator[tuple[int, list[int]]]:
    """(freeing transaction, pages) of every leaf of the free database under `root`;
    `own[0]` counts the pages the database itself takes."""
    stack = [root]
    while stack:
        pgno = stack.pop()
        own[0] += 1
        page = os.pread(fd, psize, pgno * psize)
        got, _, flags, lower, _ = _PAGE_HEAD.unpack_from(page)
        if got != pgno or len(page) != psize:
            raise PageFormatError(f"page {pgno} names itself {got}")
        for node in _nodes(page, lower):
            lo, hi, nflags, ksize = _NODE.unpack_from(page, node)
            if flags & _P_BRANCH:
                stack.append(lo | hi << 16 | nflags << 32)
            elif flags & _P_LEAF:
                key = _U64.unpack_from(page, node + 8)[0]
                size = lo | hi << 16
                start = node + 8 + ksize
                if nflags & _F_BIGDATA:
                    data, pages = _overflow(fd, psize, _U64.unpack_from(page, start)[0], size)
                    own[0] += pages
                else:
                    data = page[start : start + size]
                yield key, _idl(data)
            else:
                raise PageFormatError(f"page {pgno} of the free database has flags {flags:#x}")


def _nodes(page: bytes, lower: int) -> Iterator[int]:
    for i in range((lower - _PAGE_HEAD.size) // 2):
        yield struct.unpack_from("<H", page, _PAGE_HEAD.size + 2 * i)[0]


def _overflow(fd: int, psize: int, pgno: int, size: int) -> tuple[bytes, int]:
    """A value stored in overflow pages from `pgno`, and how many pages it takes."""
    head = os.pread(fd, _PAGE_HEAD.size, pgno * psize)
    got, _, flags, _, _ = _PAGE_HEAD.unpack_from(head)
    if got != pgno or not flags & _P_OVERFLOW:
        raise PageFormatError(f"overflow page {pgno} is not one")
    data = os.pread(fd, size, pgno * psize + _PAGE_HEAD.size)
    if len(data) != size:
        raise PageFormatError(f"overflow value at page {pgno} is cut short")
    return data, int(_OVERFLOW_PAGES.unpack_from(head, 12)[0])


def _idl(data: bytes) -> list[int]:
    """An IDL: a count, then that many page numbers."""
    if len(data) < 8:
        raise PageFormatError("free-list entry shorter than its count")
    n = _U64.unpack_from(data)[0]
    if len(data) < 8 * (n + 1):
        raise PageFormatError("free-list entry shorter than its count says")
    return list(struct.unpack_from(f"<{n}Q", data, 8))
