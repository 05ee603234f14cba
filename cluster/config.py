"""`[cluster]`: which shard this process serves, and where the cluster's objects are."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from urllib.parse import urlsplit, urlunsplit

# A shard's holder beats every second; observers count it gone after `lease_ttl` of their
# own clock without a new beat (Patroni's rule: clocks are never compared across nodes).
# With HAProxy checking every second, a dead primary's shard answers again within
# lease_ttl + promotion + one check: docs/DESIGN.md states the bound.
BEAT_INTERVAL = 1.0
LEASE_TTL = 6.0


@dataclass(frozen=True)
class ClusterConfig:
    """Every field has a default so that a file, the environment (`CKPT_CLUSTER_*`: a pod
    names its node, URL and shard) and flags can each give part; `check` runs once all
    are in."""

    node: str = ""  # this machine's name in the cluster (several processes may share it)
    url: str = ""  # where other nodes and the proxy reach this process
    # Where they reach its S3 endpoint (api/s3/): `url` with the `[s3] port`, unless given
    # (a port mapped elsewhere); "" while the endpoint is off. Beats carry it, so any
    # process can forward a bucket's request to its shard's owner, and the proxy's
    # config lists it (proxy.py).
    s3_url: str = ""
    shard: int = 0  # the shard this process's data dir holds
    shards: int = 1  # how many shards the cluster has (fixed when it is made)
    store: str = ""  # URL of the cluster's objects (beats, leases, tokens): s3://bucket/prefix
    tier: str = ""  # the [tiers.<name>] whose options (endpoint, keys) reach `store`
    # The [tiers.<name>] every node packs into, one prefix for the whole cluster, with the
    # shared chunk index beside the packs (vault/content/shared.py); "": each node its own.
    shared_tier: str = ""
    # Seconds, in the store's time, between condemning a shared pack no shard names and
    # deleting it if still none does (vault/content/sharedgc.py).
    shared_gc_grace: float = 600.0
    # Index segments of one size a GC run merges into one (vault/content/sharedcompact.py:
    # a cold start fetches ~fanin x log_fanin(packs) segments); 0: never merged.
    shared_index_fanin: int = 16
    beat_interval: float = BEAT_INTERVAL
    lease_ttl: float = LEASE_TTL
    # Seconds an upload prepared for a commit across namespaces waits for its decision
    # before it is aborted (cluster/txn.py, TXN_TIMEOUT).
    txn_timeout: float = 30.0

    def with_s3(self, port: int | None) -> ClusterConfig:
        """This config with its S3 endpoint's URL filled in from `[s3] port`."""
        if port is None:
            if self.s3_url:
                raise ValueError("[cluster] s3_url needs the S3 endpoint on ([s3] port)")
            return self
        if self.s3_url:
            return self
        parts = urlsplit(self.url)
        host = parts.hostname or "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        return replace(self, s3_url=urlunsplit((parts.scheme, f"{host}:{port}", "", "", "")))

    def check(self) -> None:
        """Raise ValueError for a configuration a cluster cannot run with."""
        for name in ("node", "url", "store"):
            if not getattr(self, name):
                raise ValueError(f"[cluster] {name} is required")
        if self.shards < 1 or not 0 <= self.shard < self.shards:
            raise ValueError(f"[cluster] shard {self.shard} is not one of 0..{self.shards - 1}")
        if not self.node or "/" in self.node or "." in self.node:
            raise ValueError("[cluster] node must be a name without '/' or '.'")
        if self.shared_tier and not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", self.node):
            raise ValueError("[cluster] node: with a shared tier, lowercase letters, digits, _ -")
        if self.shared_gc_grace <= 0:
            raise ValueError("[cluster] shared_gc_grace must be positive")
        if self.shared_index_fanin < 0:
            raise ValueError("[cluster] shared_index_fanin must be 0 or more")
        if self.lease_ttl < 3 * self.beat_interval:
            raise ValueError("[cluster] lease_ttl must be at least 3 beat intervals")
