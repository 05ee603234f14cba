"""When a replica holds mostly dead bytes: a new base, early.

A generation's replica is its newest base plus every segment after it; both keep the
frames they were given even once those are gone from the vault (demoted to a tier,
collected). A shard of a cluster that demotes into the shared tier showed it: a 256 MiB
save left 256 MiB of frames in its replica's log next to their packed copy, the bucket
holding two copies until the hourly base (issue 44); and a base taken halfway through the
demotion kept the frames still hot then (101 MiB). A base is a compacted copy of what is
live, so it costs about the live bytes; once the replica (the base this process shipped
and the log since) holds more than `RATIO` times those, and more than `FLOOR`, a base now
frees more than it ships, and the objects it makes old are deleted (shipper.py,
`_forget`). In steady writes the replica grows with the live bytes and never passes twice
them; it does when what it holds died.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..env import Env

RATIO = 2.0
FLOOR = 1 << 20  # bytes of replica below which no early base is worth its requests


def live_bytes(env: Env) -> int:
    """Bytes of the pages the environment's databases use (what a compacted copy holds,
    about), from their page counts: no walk of the data."""
    total = 0
    with env.read() as txn:
        psize = int(env.lmdb.stat()["psize"])
        for db in env.db.values():
            st = txn.stat(db)
            total += (st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]) * psize
    return total


def rebase_due(replica_bytes: int, envs: Iterable[Env]) -> bool:
    """Whether a base now is cheaper than the dead bytes it lets go."""
    if replica_bytes <= FLOOR:
        return False
    return replica_bytes > RATIO * sum(live_bytes(e) for e in envs)
