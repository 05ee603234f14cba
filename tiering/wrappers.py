"""Behaviour wrapped around any tier, never built into one: retries, and (for tests) faults.

`RetryingTier` retries what can succeed on retry, decided by type: `TierUnavailable` only,
with exponential backoff and full jitter, bounded in attempts. Not-found, already-exists and
other errors pass straight through. `FaultyTier` injects failures the way an outage or bad
disk would, so the code above can be tested against them.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from checkpoint_vault.vault.errors import TierUnavailable
from checkpoint_vault.vault.tier import Tier, modified

T = TypeVar("T")


class RetryingTier:
    def __init__(
        self,
        inner: Tier,
        attempts: int = 5,
        base: float = 0.2,
        cap: float = 5.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.name = inner.name
        self._inner = inner
        self._attempts = attempts
        self._base = base
        self._cap = cap
        self._sleep = sleep  # injected so tests do not wait

    def _call(self, fn: Callable[[], T]) -> T:
        for attempt in range(self._attempts):
            try:
                return fn()
            except TierUnavailable:
                if attempt == self._attempts - 1:
                    raise
                self._sleep(random.uniform(0, min(self._cap, self._base * 2**attempt)))  # noqa: S311
        raise AssertionError("unreachable")

    def put(self, key: str, data: bytes | memoryview, *, if_absent: bool = False) -> None:
        self._call(lambda: self._inner.put(key, data, if_absent=if_absent))

    def get(self, key: str) -> bytes:
        return self._call(lambda: self._inner.get(key))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self._call(lambda: self._inner.get_range(key, start, length))

    def head(self, key: str) -> int | None:
        return self._call(lambda: self._inner.head(key))

    def modified(self, key: str) -> float | None:
        return self._call(lambda: modified(self._inner, key))

    def delete(self, key: str) -> None:
        self._call(lambda: self._inner.delete(key))

    def list(self, prefix: str = "") -> Iterator[str]:
        return iter(self._call(lambda: list(self._inner.list(prefix))))


class FaultyTier:
    """Fails the next `fail_next` calls with TierUnavailable; flips a bit in every KiB of
    what `get` and `get_range` return while `corrupt_reads` is set."""

    def __init__(self, inner: Tier) -> None:
        self.name = inner.name
        self._inner = inner
        self.fail_next = 0
        self.corrupt_reads = False
        self.calls = 0

    def _gate(self) -> None:
        self.calls += 1
        if self.fail_next > 0:
            self.fail_next -= 1
            raise TierUnavailable(f"tier {self.name}: injected outage")

    def _maybe_flip(self, data: bytes) -> bytes:
        if self.corrupt_reads and data:
            flipped = bytearray(data)
            for i in range(len(flipped) // 2 % 1024, len(flipped), 1024):
                flipped[i] ^= 0x01
            return bytes(flipped)
        return data

    def put(self, key: str, data: bytes | memoryview, *, if_absent: bool = False) -> None:
        self._gate()
        self._inner.put(key, data, if_absent=if_absent)

    def get(self, key: str) -> bytes:
        self._gate()
        return self._maybe_flip(self._inner.get(key))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self._gate()
        return self._maybe_flip(self._inner.get_range(key, start, length))

    def head(self, key: str) -> int | None:
        self._gate()
        return self._inner.head(key)

    def modified(self, key: str) -> float | None:
        self._gate()
        return modified(self._inner, key)

    def delete(self, key: str) -> None:
        self._gate()
        self._inner.delete(key)

    def list(self, prefix: str = "") -> Iterator[str]:
        self._gate()
        return self._inner.list(prefix)
