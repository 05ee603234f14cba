"""CPU time of a process and its children, read from /proc, for the benches that charge
the server for what it did (Linux only)."""

from __future__ import annotations

import os
from pathlib import Path


def tree_cpu(pid: int) -> float:
    """User + system CPU seconds so far of process `pid` and its live descendants (the
    server's worker processes answer requests of their own), from /proc/PID/stat."""
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue  # gone meanwhile (a worker replaced): its CPU is lost to the figure
    return total
