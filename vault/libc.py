"""The C library's calls that Python's os module lacks, bound in one place.

Seven modules each loaded libc with ctypes for one call (issue 42 counted them); a binding
with the wrong argument types corrupts memory silently, so they are written once, typed,
here. Each call is Linux's: elsewhere (no such symbol) it does nothing and says so by its
return, as its docstring states; none raises for a missing symbol. The client binds its
one call (sync_file_range) itself in client/filesink.py: it may not import the engine.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from typing import Any

_PR_SET_NAME = 15
_PR_SET_PDEATHSIG = 1
_MADV_DONTNEED = 4
FALLOC_PUNCH_HOLE = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
SYNC_FILE_RANGE_WRITE = 2
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # mallopt parameters


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, loaded once (a dlopen per 8 MiB read showed in profiles)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


@functools.cache
def _bound(name: str, argtypes: tuple[Any, ...], restype: Any = ctypes.c_int) -> Any:
    """libc's `name` with its argument types set, or None where there is none. A function
    object of its own (`libc[name]`, not the attribute ctypes caches), so two bindings of
    one symbol with other types (prctl's) do not overwrite each other's."""
    libc = _libc()
    if libc is None:
        return None
    try:
        fn = libc[name]
    except AttributeError:
        return None
    fn.argtypes = argtypes
    fn.restype = restype
    return fn


def _raise_errno() -> None:
    err = ctypes.get_errno()
    raise OSError(err, os.strerror(err))


def set_thread_name(name: str) -> None:
    """The calling thread's name in the kernel (15 bytes), as `top -H` shows it."""
    fn = _bound("prctl", (ctypes.c_int, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_ulong))
    if fn is not None:
        fn(_PR_SET_NAME, name.encode()[:15], 0, 0)


def signal_on_parent_death(signal: int) -> bool:
    """Have the kernel send `signal` to this process when its parent dies; False where it
    cannot (the process then outlives a SIGKILL of its parent)."""
    prctl = _bound("prctl", (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong))
    return prctl is not None and prctl(_PR_SET_PDEATHSIG, signal, 0, 0) == 0


def mallopt(param: int, value: int) -> bool:
    """glibc's malloc tuning (node/serve.py tune_malloc); False where there is none."""
    fn = _bound("mallopt", (ctypes.c_int, ctypes.c_int))
    return fn is not None and fn(param, value) == 1


def sync_file_range(fd: int, offset: int, length: int, flags: int) -> bool:
    """Start (or wait for) write-back of a stretch of a file; False where there is none."""
    fn = _bound("sync_file_range", (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint))
    if fn is None:
        return False
    if fn(fd, offset, length, flags) != 0:
        _raise_errno()
    return True


def madvise_dontneed(start: int, length: int) -> None:
    """Drop this process's mapping of the pages in [start, start+length) (the page cache
    keeps them); nothing where there is no madvise."""
    fn = _bound("madvise", (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int))
    if fn is not None:
        fn(ctypes.c_void_p(start), ctypes.c_size_t(length), _MADV_DONTNEED)


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Give a stretch of a file back to the file system, its size unchanged; OSError
    where the file system (or the platform) cannot."""
    fn = _bound("fallocate", (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64))
    if fn is None:
        raise OSError(95, "fallocate is not offered here")  # EOPNOTSUPP
    if fn(fd, FALLOC_PUNCH_HOLE, offset, length) != 0:
        _raise_errno()
