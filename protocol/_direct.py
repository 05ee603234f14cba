"""Where a file may be written with direct I/O from a buffer that is reused once the write
returns: the server's local restores (vault/deliver.py) and the client's downloads
(client/filesink.py) must agree on it.

Local block file systems read the caller's buffer before a direct write returns and keep no
reference to it. A FUSE file system may hand the caller's pages by reference to its daemon,
which can keep them past its answer: a buffer refilled after the write would then change
bytes already "written", after they were verified. So direct writes only where `f_type`
says ext2/3/4, XFS or Btrfs.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any

# statfs f_type values (linux/magic.h): ext2/3/4, XFS, Btrfs
BLOCK_FILE_SYSTEMS = frozenset({0xEF53, 0x58465342, 0x9123683E})


@functools.cache
def _fstatfs() -> Any:
    """libc's fstatfs, bound once (a dlopen per call showed in profiles), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True)["fstatfs"]
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_void_p)
    fn.restype = ctypes.c_int
    return fn


def file_system_type(fd: int) -> int | None:
    """The magic number of the file system holding the open file `fd` (`fstatfs`'s
    f_type, the struct's first field: a long), or None where it cannot be known."""
    fn = _fstatfs()
    if fn is None:
        return None
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit Linux
    if fn(fd, buf) != 0:
        return None
    return ctypes.c_long.from_buffer(buf).value


def direct_safe(fd: int) -> bool:
    """Whether direct writes into `fd` from a reused buffer are safe (module doc)."""
    return file_system_type(fd) in BLOCK_FILE_SYSTEMS
