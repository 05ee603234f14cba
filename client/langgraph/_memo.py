"""What a saver remembers between calls, bounded: a process may serve threads for weeks.

`VaultSaver` writes from LangGraph's threads (each put and put_writes on the thread that
made it) while its reads run on the client's loop thread, so every structure here takes a
lock around each operation, and the steps that must see one state (a put starting, a
writes call deciding whether to wait for it) are `Memo` methods under its lock.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ..errors import IntegrityError
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
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            return self._d.get(key)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._d

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._d[key] = value
            self._d.move_to_end(key)
            while len(self._d) > self._cap:
                self._d.popitem(last=False)

    def pop(self, key: K) -> V | None:
        with self._lock:
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
        self._lock = threading.Lock()

    def get(self, digest: str) -> bytes | None:
        with self._lock:
            data = self._d.get(digest)
            if data is not None:
                self._d.move_to_end(digest)
            return data

    def put(self, digest: str, data: bytes) -> None:
        with self._lock:
            if digest in self._d or len(data) > self._limit // 4:
                return
            self._d[digest] = data
            self._size += len(data)
            while self._size > self._limit:
                _, old = self._d.popitem(last=False)
                self._size -= len(old)


@dataclass(frozen=True)
class Held:
    """What a later put needs of a committed checkpoint (its parent): the record's id, its
    files' (hash, size) and its channels' serde types. Taken from a record read back, or
    straight from a put's answer (JSON): checking and building a whole record there cost
    ~10% of a put's client CPU, for three fields."""

    id: str
    files: dict[str, tuple[str, int]]
    channels: dict[str, str]

    @classmethod
    def of(cls, answer: Record | Mapping[str, Any]) -> Held:
        """IntegrityError when an answer is no checkpoint record."""
        if isinstance(answer, Record):
            files = {name: (f.hash, f.size) for name, f in answer.files.items()}
            return cls(answer.id, files, dict(answer.metadata.get("channels") or {}))
        try:
            files = {str(n): (str(f["hash"]), int(f["size"])) for n, f in answer["files"].items()}
            channels = answer["metadata"].get("channels") or {}
            return cls(str(answer["id"]), files, {str(k): str(v) for k, v in channels.items()})
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise IntegrityError(f"a save's answer is no checkpoint record: {e!r}") from None


@dataclass
class Memo:
    """Shared by every copy of one saver (`with_allowlist` makes shallow copies that differ
    only in their serializer)."""

    loop: asyncio.AbstractEventLoop | None
    cache_bytes: int = CACHE_BYTES
    # Checkpoints known to be committed, with what a put on top of them needs.
    committed: Lru[Key, Held] = field(default_factory=lambda: Lru(REMEMBERED))
    # Puts on their way: writes for these wait, so they commit after their checkpoint;
    # what the first of them waits on is made then (most puts have no writes waiting).
    inflight: dict[Key, Future[None] | None] = field(default_factory=dict)
    # Writes whose checkpoint's put has not started: that put carries them too.
    early: Lru[Key, list[StoredWrite]] = field(default_factory=lambda: Lru(EARLY_KEYS))
    puts_since_prune: Lru[str, int] = field(default_factory=lambda: Lru(REMEMBERED))
    pruning: set[str] = field(default_factory=set)
    files: FileCache = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.files = FileCache(self.cache_bytes)

    def begin_put(self, key: Key) -> list[StoredWrite]:
        """A put of `key` is on its way (writes for it wait from now); the writes that
        came before it started, which it carries."""
        with self._lock:
            self.inflight[key] = None
            return self.early.pop(key) or []

    def end_put(self, key: Key) -> None:
        """The put of `key` ended, committed or not: writes waiting for it go on."""
        with self._lock:
            done = self.inflight.pop(key)
        if done is not None:
            done.set_result(None)

    def before_writes(self, key: Key, writes: list[StoredWrite]) -> Future[None] | None:
        """The put that writes for `key` must wait for, if it is on its way; if it has not
        started, `writes` are kept for it to carry too (in case their own record commits
        first: a reader takes writes older than their checkpoint from it)."""
        with self._lock:
            if key in self.inflight:
                pending = self.inflight[key]
                if pending is None:
                    pending = self.inflight[key] = Future()
                return pending
            if key not in self.committed:
                self.early.put(key, (self.early.get(key) or []) + writes)
            return None

    def prune_due(self, namespace: str, every: int) -> bool:
        """Count a put of `namespace`; True (and it is now being pruned) on the `every`-th
        since its last pruning, unless one is under way."""
        with self._lock:
            count = (self.puts_since_prune.get(namespace) or 0) + 1
            self.puts_since_prune.put(namespace, count)
            if count < every or namespace in self.pruning:
                return False
            self.puts_since_prune.put(namespace, 0)
            self.pruning.add(namespace)
            return True

    def pruned(self, namespace: str) -> None:
        with self._lock:
            self.pruning.discard(namespace)
