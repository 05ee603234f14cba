"""The HTTP side of a cluster (cluster/ is the engine side, and speaks no HTTP): each
process's membership, leases and takeover (context.py) and requests for another shard
forwarded to its owner (forward.py), and answers about the whole vault gathered from
every shard's owner (whole.py)."""

from .context import CLUSTER, cluster_context, cluster_middleware, passed_on

__all__ = ["CLUSTER", "cluster_context", "cluster_middleware", "passed_on"]
