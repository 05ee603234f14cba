"""A real in-memory tier: the same semantics as the others, for unit tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from checkpoint_vault.vault.errors import ObjectExists, ObjectNotFound
from checkpoint_vault.vault.tier import check_key


class MemoryTier:
    def __init__(self, name: str = "memory", clock: Callable[[], float] = time.time) -> None:
        """`clock`: the store's clock, which `modified` answers by (a test's fake one)."""
        self.name = name
        self._clock = clock
        self._objects: dict[str, bytes] = {}
        self._times: dict[str, float] = {}
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes | memoryview, *, if_absent: bool = False) -> None:
        check_key(key)
        with self._lock:
            if if_absent and key in self._objects:
                raise ObjectExists(f"tier {self.name}: {key} exists")
            self._objects[key] = bytes(data)
            self._times[key] = self._clock()

    def get(self, key: str) -> bytes:
        with self._lock:
            try:
                return self._objects[check_key(key)]
            except KeyError:
                raise ObjectNotFound(f"tier {self.name}: no object {key}") from None

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self.get(key)[start : start + length]

    def head(self, key: str) -> int | None:
        with self._lock:
            data = self._objects.get(check_key(key))
        return None if data is None else len(data)

    def modified(self, key: str) -> float | None:
        with self._lock:
            return self._times.get(check_key(key))

    def delete(self, key: str) -> None:
        with self._lock:
            self._objects.pop(check_key(key), None)
            self._times.pop(key, None)

    def list(self, prefix: str = "") -> Iterator[str]:
        with self._lock:
            keys = [k for k in self._objects if k.startswith(prefix)]
        return iter(keys)
