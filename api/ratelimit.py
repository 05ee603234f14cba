"""Request rate limits per token: one token bucket per token name.

A token may make `rate` requests per second on average and `burst` at once; beyond that
it is answered 429 `rate_limited` with `Retry-After` (the seconds until a request would be
allowed), and nothing else is done for it. Other tokens are unaffected, which is the
point: one flooding tenant cannot starve the rest. Admin tokens are not limited (the
operator's tools must work during a flood). Buckets live in memory, per process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vault import Clock

from .errors import ApiError


class RateLimited(ApiError):
    code = "rate_limited"

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = max(1, math.ceil(retry_after))


@dataclass
class _Bucket:
    tokens: float
    at: float


class RateLimiter:
    def __init__(self, rate: float, burst: float, clock: Clock) -> None:
        self.rate = rate  # requests per second; 0 turns limiting off
        self.burst = max(burst, 1.0)
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self.refused = 0  # for /metrics

    def take(self, name: str) -> None:
        """Spend one request of token `name`'s allowance, or raise RateLimited."""
        if self.rate <= 0:
            return
        now = self._clock.now()
        bucket = self._buckets.setdefault(name, _Bucket(self.burst, now))
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.rate)
        bucket.at = now
        if bucket.tokens < 1.0:
            self.refused += 1
            wait = (1.0 - bucket.tokens) / self.rate
            raise RateLimited(
                f"token {name!r} is over {self.rate:g} requests per second", retry_after=wait
            )
        bucket.tokens -= 1.0
