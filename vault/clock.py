"""The one place the engine reads wall-clock time.

Retention, GC grace periods and upload expiry are all decisions about time; injecting the
clock lets tests move time forward instead of sleeping.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the Unix epoch."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()


class FakeClock:
    """A clock tests can move by hand."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def rfc3339(ts: float) -> str:
    """Format a Unix time as an RFC 3339 UTC string with millisecond precision. Every
    record an answer carries is formatted here, so without a datetime: the microseconds
    are rounded as `datetime.fromtimestamp` rounds them (half to even, carried into the
    second), which gives the same text at half the cost."""
    frac, whole = math.modf(ts)
    second, micros = int(whole), round(frac * 1e6)
    if micros >= 1_000_000:
        second, micros = second + 1, micros - 1_000_000
    elif micros < 0:
        second, micros = second - 1, micros + 1_000_000
    return f"{_utc_second(second)}{micros // 1000:03d}Z"


@functools.lru_cache(maxsize=1024)
def _utc_second(second: int) -> str:
    """A whole second's text: records answered together were made in the same few seconds
    (gmtime and strftime were ~1% of a worker's CPU per small save). A pure function's
    memo, not state: the same second always gives the same text."""
    return time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(second))
