"""File-system steps that durability needs, shared by the engine and the local tier (which
may use nothing else of the engine's insides: tests/test_boundaries_content.py)."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make the entries of directory `path` durable: a file created or renamed in it is
    only there after a power loss once its directory is synced too."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
