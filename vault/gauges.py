"""What monitoring reads of a running vault at scrape time: `Vault.observe`'s answer.

Not an HTTP answer (GET /v1/stats answers `protocol.StatsReport`, which this holds): it is
what api/observability.py turns into Prometheus gauges and counters, so it is typed here,
field by field, instead of being read by string keys.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol import StatsReport

from .samples import NamespaceBytes
from .writer import WriterStats


@dataclass(frozen=True)
class MapUse:
    """An LMDB environment's map: bytes in use and its current size."""

    used: int
    size: int


@dataclass(frozen=True)
class Observation:
    """Gauges of a running vault: its stats, upload sessions (and per token), LMDB maps,
    the writer, how committed files' hashes were proven, files handed over by descriptor,
    and each namespace's recovery point."""

    stats: StatsReport
    upload_sessions: int
    # "sessions" and "pending_bytes", each by token name
    uploads_by_token: dict[str, dict[str, int]]
    maps: dict[str, MapUse]  # "catalog", "frames"
    writer: WriterStats
    save_journal: bool  # one-request saves may be acknowledged by their journal record
    commit_file_hashes: dict[str, int]
    handed_over: dict[str, int]
    writer_queue: int
    # seconds since the newest and the newest valid checkpoint (None: there is none)
    recovery_seconds: dict[str, tuple[float | None, float | None]]
    namespace_usage: dict[str, NamespaceBytes]
