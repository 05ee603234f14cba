"""Storage samples: logical, stored and on-disk bytes over time, for the web console's chart.

The counters in the catalog say what the vault holds now; nothing else remembers how that
moved. A sample is taken at each usage scan (`Vault.usage`: the per-namespace figures
only exist then), and the schedule runs a scan at a bounded interval
(`[maintenance] sample_interval`, the `usage` task of maintenance/tasks.py). Samples live in the
catalog (database `samples`, appended last to `CATALOG_DBS`), so they are replicated and
backed up with it and survive restarts. A sample is the wire's `StorageSample` record
(protocol/_admin.py), stored as its JSON.

Keys are the sample's time in milliseconds (8 bytes, big endian), so a forward scan is the
history in order and two samples in one millisecond keep the later. The table is bounded
twice, in the same transaction that appends: samples older than `MAX_AGE_SECONDS` go, and
past `MAX_SAMPLES` the oldest go. At one sample per usage scan (every ten minutes at most
when compaction recodes, else per interval) that is weeks of history in a few megabytes.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import lmdb

from checkpoint_vault.protocol import NamespaceBytes, StorageSample, Usage

from .errors import InvalidRequest

if TYPE_CHECKING:
    from .env import Env
    from .writer import Writer


class SampleParts(Protocol):
    """What the storage samples need of the store: the catalog's tables and the writer."""

    @property
    def catalog_env(self) -> Env: ...
    @property
    def writer(self) -> Writer: ...


_KEY = struct.Struct(">Q")
MAX_SAMPLES = 4096  # ~400 B each with a few namespaces: a few MB at most
MAX_AGE_SECONDS = 90 * 86400.0  # a quarter of history is what a chart of "lately" needs
MAX_LIST = 4096

__all__ = ["NamespaceBytes", "StorageSample", "StorageSamples", "allocated_bytes"]


def allocated_bytes(root: Path) -> int:
    """Bytes the files under `root` take on disk: st_blocks x 512, summed (as `du` counts;
    sparse LMDB maps count only what is written). Files vanishing meanwhile are skipped."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                continue  # removed between the listing and the stat
    return total


class StorageSamples:
    """The `samples` table: append (pruning as it goes) and read back in time order."""

    def __init__(
        self, store: SampleParts, max_samples: int = MAX_SAMPLES, max_age: float = MAX_AGE_SECONDS
    ) -> None:
        self._s = store
        self._db = store.catalog_env.db["samples"]
        self._max_samples = max_samples
        self._max_age = max_age

    def append(self, sample: StorageSample) -> None:
        raw = json.dumps(sample.to_wire(), separators=(",", ":")).encode()
        key = _KEY.pack(int(sample.at * 1000))
        oldest_kept = _KEY.pack(max(0, int((sample.at - self._max_age) * 1000)))

        def write(txn: lmdb.Transaction) -> None:
            txn.put(key, raw, db=self._db)
            excess = int(txn.stat(self._db)["entries"]) - self._max_samples
            cur = txn.cursor(db=self._db)
            ok = cur.first()
            while ok and (excess > 0 or bytes(cur.key()) < oldest_kept):
                excess -= 1
                ok = cur.delete()  # moves to the next entry

        self._s.writer.run(lambda w: write(w.catalog))

    def history(self, since: float | None = None, limit: int = 1000) -> list[StorageSample]:
        """The newest `limit` samples taken at or after `since` (epoch seconds), oldest
        first (the order a chart draws them in)."""
        if not 1 <= limit <= MAX_LIST:
            raise InvalidRequest(f"limit must be 1 to {MAX_LIST}")
        floor = _KEY.pack(max(0, int(since * 1000))) if since is not None else b""
        out: list[StorageSample] = []
        with self._s.catalog_env.read() as txn:
            cur = txn.cursor(db=self._db)
            ok = cur.last()
            while ok and len(out) < limit and bytes(cur.key()) >= floor:
                out.append(StorageSample.from_wire(json.loads(bytes(cur.value()))))
                ok = cur.prev()
        out.reverse()
        return out

    def newest(self) -> StorageSample | None:
        found = self.history(limit=1)
        return found[0] if found else None


def usage_sample(
    at: float, logical: int, stored: int, disk_bytes: int, usage: Mapping[str, Usage]
) -> StorageSample:
    """The storage sample of a usage scan that just ran: the totals then, the vault
    directory's allocated bytes (what `du` shows), each namespace's bytes."""
    return StorageSample(
        at=at,
        logical_bytes=logical,
        stored_bytes=stored,
        disk_bytes=disk_bytes,
        namespaces={
            ns: NamespaceBytes(u.logical_bytes, u.stored_bytes) for ns, u in sorted(usage.items())
        },
    )
