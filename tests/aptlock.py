"""One `apt-get` at a time among the suite's processes.

The suite runs in several pytest-xdist workers. On a fresh machine the tests that need a
Debian package (haproxy for the cluster, postgresql for the LangGraph import, chromium for
the console) may find it missing in two workers at once; the second `apt-get` would then
fail at once on dpkg's lock ("Could not get lock /var/lib/dpkg/lock-frontend"). Callers
hold `apt_lock()` around their check-then-install, and check again inside it: the worker
that waited finds the package the other one installed.
"""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK = Path(tempfile.gettempdir()) / "ckpt-tests-apt.lock"


@contextmanager
def apt_lock() -> Iterator[None]:
    """Held exclusively until the block ends; the kernel drops it if the process dies."""
    with open(LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
