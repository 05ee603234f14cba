"""Continuous replication to an object-store tier, and restore from it (issue 15)."""

from .restore import restore_replica
from .shipper import ReplicationConfig, Replicator

__all__ = ["ReplicationConfig", "Replicator", "restore_replica"]
