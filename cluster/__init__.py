"""Several vault nodes as one service over one object store (docs/DESIGN.md, "A cluster").

A shard is one engine data dir, replicated to its own prefix of the bucket; namespaces map
to shards by a hash of their first segment (`shards.py`), the same hash HAProxy computes
(`proxy.py`). Each process of the cluster publishes a beat to the store (`members.py`); the
primary of a shard claims its epoch with a conditional create (`lease.py`), the epoch its
replication writes under, so a takeover is the standby's promotion plus the next claim.
Tokens are the cluster's, mirrored through the store (`tokens.py`). Nothing here speaks
HTTP: api/cluster/context.py is the glue.
"""

from __future__ import annotations

from .config import ClusterConfig
from .errors import ClusterConflict, NotOwner
from .members import Member, Roster
from .node import ClusterNode
from .shards import shard_of, upload_shard

__all__ = [
    "ClusterConfig",
    "ClusterConflict",
    "ClusterNode",
    "Member",
    "NotOwner",
    "Roster",
    "shard_of",
    "upload_shard",
]
