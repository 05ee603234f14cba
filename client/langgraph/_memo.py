"""What a saver remembers between calls, bounded: a process may serve threads for weeks.

All of it is touched only on the saver's event loop, so none of it needs a lock.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ..models import Checkpoint as Record
from ._codec import StoredWrite

K = TypeVar("K")
V = TypeVar("V")
Key = tuple[str, str, str]  # (vault namespace, checkpoint_ns, checkpoint_id)

REMEMBERED = 1024  # checkpoint records kept for parents and "already committed"
EARLY_KEYS = 256  # checkpoints with early writes waiting for their put
CACHE_BYTES = 64 << 20  # file contents by hash


class Lru(Generic[K, V]):
    """A dict that forgets its least recently stored entries past `cap`."""

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._d: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        return self._d.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def put(self, key: K, value: V) -> None:
        self._d[key] = value
        self._d.move_to_end(key)
        while len(self._d) > self._cap:
            self._d.popitem(last=False)

    def pop(self, key: K) -> V | None:
        return self._d.pop(key, None)


class FileCache:
    """File contents by BLAKE3 hash, least recently used out first past `limit` bytes.

    Content-addressed, so never stale: a checkpoint read right after this process saved it
    (LangGraph reads the latest checkpoint at the start of every run) and a message history
    that did not change since the last read cost no download."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._size = 0
        self._d: OrderedDict[str, bytes] = OrderedDict()

    def get(self, digest: str) -> bytes | None:
        data = self._d.get(digest)
        if data is not None:
            self._d.move_to_end(digest)
        return data

    def put(self, digest: str, data: bytes) -> None:
        if digest in self._d or len(data) > self._limit // 4:
            return
        self._d[digest] = data
        self._size += len(data)
        while self._size > self._limit:
            _, old = self._d.popitem(last=False)
            self._size -= len(old)


@dataclass
class Memo:
    """Shared by every copy of one saver (`with_allowlist` makes shallow copies that differ
    only in their serializer)."""

    loop: asyncio.AbstractEventLoop | None
    cache_bytes: int = CACHE_BYTES
    # Checkpoints known to be committed, with their records (parent and file hashes).
    committed: Lru[Key, Record] = field(default_factory=lambda: Lru(REMEMBERED))
    # Puts on their way: writes for these wait, so they commit after their checkpoint.
    inflight: dict[Key, asyncio.Future[None]] = field(default_factory=dict)
    # Writes whose checkpoint's put has not started: that put carries them too.
    early: Lru[Key, list[StoredWrite]] = field(default_factory=lambda: Lru(EARLY_KEYS))
    puts_since_prune: Lru[str, int] = field(default_factory=lambda: Lru(REMEMBERED))
    pruning: set[str] = field(default_factory=set)
    files: FileCache = field(init=False)

    def __post_init__(self) -> None:
        self.files = FileCache(self.cache_bytes)
