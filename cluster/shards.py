"""Which shard a namespace or an upload belongs to.

The hash is CRC-32 (zlib's, which is HAProxy's `crc32` converter) of the whole namespace,
modulo the shard count. The proxy computes it from the path alone (cluster/proxy.py cuts
the namespace out of `/v1/namespaces/{ns}/checkpoints...`, `/uploads` or `/policy` with
`regsub` and decodes it). The whole name and not its first segment: LangGraph's threads
are all `langgraph/<thread>`, and would all have landed on one shard. Upload ids carry
their shard as a prefix (`<shard>-<hex>`), since `/v1/uploads/{id}` names no namespace.
"""

from __future__ import annotations

import zlib


def shard_of(namespace: str, shards: int) -> int:
    return zlib.crc32(namespace.encode()) % shards


def upload_prefix(shard: int) -> str:
    return f"{shard}-"


def upload_shard(upload_id: str) -> int | None:
    """The shard an upload id names, or None for an id without one (a single node's)."""
    head, sep, _ = upload_id.partition("-")
    return int(head) if sep and head.isdigit() and len(head) <= 6 else None
