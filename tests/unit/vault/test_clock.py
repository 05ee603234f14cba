"""rfc3339 formats times exactly as datetime does, rounding included."""

from __future__ import annotations

import random
from datetime import datetime, timezone

import pytest

from checkpoint_vault.vault.clock import rfc3339


def _by_datetime(ts: float) -> str:
    dt = datetime.fromtimestamp(ts, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


@pytest.mark.parametrize(
    "ts",
    [0.0, 0.0005, 0.9999995, 1.0005, 1_700_000_000.0005, 1_700_000_000.9999996, 2**31 + 0.5],
)
def test_edges_match_datetime(ts: float) -> None:
    assert rfc3339(ts) == _by_datetime(ts)


def test_random_times_match_datetime() -> None:
    rng = random.Random(7)
    for _ in range(20_000):
        ts = rng.choice((rng.uniform(0, 4e9), round(rng.uniform(1.6e9, 1.9e9), 3)))
        assert rfc3339(ts) == _by_datetime(ts), ts


def test_known_value() -> None:
    assert rfc3339(1_800_000_000.25) == "2027-01-15T08:00:00.250Z"
