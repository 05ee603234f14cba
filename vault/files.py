"""File-system steps that durability needs, shared by the engine and the local tier (which
may use nothing else of the engine's insides: tests/test_boundaries_content.py)."""

from __future__ import annotations

import os
from pathlib import Path

from .libc import SYNC_FILE_RANGE_WRITE, sync_file_range


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Have the kernel start writing a stretch of a file back, without waiting for it: left
    alone it waits until dirty pages pass a share of RAM, and a later fsync then writes the
    whole file at once. Linux only (`sync_file_range(SYNC_FILE_RANGE_WRITE)`); elsewhere
    nothing. (The client has its own, client/filesink.py: it may not import the engine.)"""
    if length > 0:
        sync_file_range(fd, offset, length, SYNC_FILE_RANGE_WRITE)


def fsync_dir(path: Path) -> None:
    """Make the entries of directory `path` durable: a file created or renamed in it is
    only there after a power loss once its directory is synced too."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
