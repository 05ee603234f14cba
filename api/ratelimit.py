"""Request rate limits per token: one token bucket per token name, shared by the service's
processes.

A token may make `rate` requests per second on average and `burst` at once; beyond that
it is answered 429 `rate_limited` with `Retry-After` (the seconds until a request would be
allowed), and nothing else is done for it. Other tokens are unaffected, which is the
point: one flooding tenant cannot starve the rest. Admin tokens are not limited (the
operator's tools must work during a flood).

The buckets live in a small file in the data dir (`LIMITS_FILE`), mapped by every process
of the service (api/workers.py), so a token's allowance is the service's, not each
process's: with buckets in memory, N processes allowed N times the rate. A bucket is a
slot of 32 bytes (BLAKE2b-128 of the name, tokens left, time of the last update), found
by linear probing from the name's hash; each update holds an exclusive `lockf` on the file
(a few microseconds; only the event loop thread of each process takes). A full
neighbourhood reuses the bucket idle longest, which at worst gives that token a full
burst again. The writing process makes the file afresh at each start.
"""

from __future__ import annotations

import fcntl
import hashlib
import math
import mmap
import os
import struct
from pathlib import Path

from checkpoint_vault.vault import Clock
from checkpoint_vault.vault.ownership import open_private

from .errors import ApiError

LIMITS_FILE = "ckpt-limits"
SLOTS = 4096
PROBES = 64  # slots looked at from a name's home slot
_SLOT = struct.Struct("<16sdd")  # name hash, tokens, time (seconds)
_EMPTY = bytes(16)


class RateLimited(ApiError):
    code = "rate_limited"

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = max(1, math.ceil(retry_after))


class RateLimiter:
    def __init__(self, rate: float, burst: float, clock: Clock, path: Path, fresh: bool) -> None:
        """`path`: the buckets' file; `fresh`: make it empty (the writing process, at
        start), else map the one it made (a worker)."""
        self.rate = rate  # requests per second; 0 turns limiting off
        self.burst = max(burst, 1.0)
        self._clock = clock
        flags = os.O_RDWR | (os.O_CREAT | os.O_TRUNC if fresh else 0)
        self._fd = open_private(path, flags)  # no symlink, no other user's file
        os.ftruncate(self._fd, SLOTS * _SLOT.size)
        self._map = mmap.mmap(self._fd, SLOTS * _SLOT.size)
        self.refused = 0  # by this process, for /metrics

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)

    def take(self, name: str) -> None:
        """Spend one request of token `name`'s allowance, or raise RateLimited."""
        if self.rate <= 0:
            return
        now = self._clock.now()
        key = hashlib.blake2b(name.encode(), digest_size=16).digest()
        fcntl.lockf(self._fd, fcntl.LOCK_EX)
        try:
            slot = self._slot(key, now)
            _, tokens, at = _SLOT.unpack_from(self._map, slot)
            tokens = min(self.burst, tokens + max(0.0, now - at) * self.rate)
            allowed = tokens >= 1.0
            _SLOT.pack_into(self._map, slot, key, tokens - 1.0 if allowed else tokens, now)
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)
        if not allowed:
            self.refused += 1
            raise RateLimited(
                f"token {name!r} is over {self.rate:g} requests per second",
                retry_after=(1.0 - tokens) / self.rate,
            )

    def _slot(self, key: bytes, now: float) -> int:
        """The offset of `key`'s bucket, claimed (full) if it had none (under the lock)."""
        home = int.from_bytes(key[:8], "little") % SLOTS
        idlest, idlest_at = -1, math.inf
        for i in range(PROBES):
            offset = (home + i) % SLOTS * _SLOT.size
            held, _, at = _SLOT.unpack_from(self._map, offset)
            if held == key:
                return offset
            if held == _EMPTY:
                idlest = offset
                break
            if at < idlest_at:
                idlest, idlest_at = offset, at
        _SLOT.pack_into(self._map, idlest, key, self.burst, now)
        return idlest
