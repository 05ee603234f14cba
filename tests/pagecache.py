"""How much of a file the page cache holds: restores written with direct I/O leave it
out, and the tests that say so count its pages (mincore over a private mapping, which
reads nothing in)."""

from __future__ import annotations

import ctypes
import mmap
from pathlib import Path


def resident_pages(path: Path) -> tuple[int, int]:
    """(pages of the file in the page cache, pages of the file)."""
    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    vec = ctypes.create_string_buffer(pages)
    with path.open("rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        anchor = ctypes.c_char.from_buffer(m)
        try:
            result = libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), size, vec)
        finally:
            del anchor  # the map cannot close while ctypes holds a view of it
    assert result == 0, ctypes.get_errno()
    return sum(b & 1 for b in vec.raw), pages
