"""A real in-memory tier: the same semantics as the others, for unit tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from checkpoint_vault.vault.errors import ObjectExists, ObjectNotFound
from checkpoint_vault.vault.tier import check_key


class MemoryTier:
    def __init__(self, name: str = "memory") -> None:
        self.name = name
        self._objects: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes | memoryview, *, if_absent: bool = False) -> None:
        check_key(key)
        with self._lock:
            if if_absent and key in self._objects:
                raise ObjectExists(f"tier {self.name}: {key} exists")
            self._objects[key] = bytes(data)

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

    def delete(self, key: str) -> None:
        with self._lock:
            self._objects.pop(check_key(key), None)

    def list(self, prefix: str = "") -> Iterator[str]:
        with self._lock:
            keys = [k for k in self._objects if k.startswith(prefix)]
        return iter(keys)
