"""Continuous replication to an object-store tier, restore from it, a read-only standby
following it, and promotion with fencing (issue 15)."""

from .follow import FollowConfig, Follower, is_standby
from .restore import restore_replica
from .shipper import ReplicationConfig, Replicator

__all__ = [
    "FollowConfig",
    "Follower",
    "ReplicationConfig",
    "Replicator",
    "is_standby",
    "restore_replica",
]
