"""What monitoring reads of a running vault at scrape time: `Vault.observe`'s answer.

Not an HTTP answer (GET /v1/stats answers `protocol.StatsReport`, which this holds): it is
what api/observability.py turns into Prometheus gauges and counters, so it is typed here,
field by field, instead of being read by string keys.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from checkpoint_vault.protocol import StatsReport

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
    # how small files' bases were found for their patches (vault/smallfile.py BaseCounts)
    small_file_bases: dict[str, int]


class HandedOver:
    """Files (and their bytes) clients on this machine handed over by descriptor, since
    start: to save from (`files`, `bytes`) and to restore into (`restored_files`, ...).
    Counted by the threads that read or wrote them, read by /metrics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = {"files": 0, "bytes": 0, "restored_files": 0, "restored_bytes": 0}

    def count(self, prefix: str, size: int) -> None:
        """One file of `size` bytes; `prefix`: "" saved from, "restored_" restored into."""
        with self._lock:
            self._counts[prefix + "files"] += 1
            self._counts[prefix + "bytes"] += size

    def totals(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
