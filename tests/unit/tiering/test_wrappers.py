from __future__ import annotations

import pytest

from checkpoint_vault.tiering import MemoryTier
from checkpoint_vault.tiering.wrappers import FaultyTier, RetryingTier
from checkpoint_vault.vault.errors import ObjectNotFound, TierUnavailable


def test_retries_only_what_can_succeed_on_retry() -> None:
    faulty = FaultyTier(MemoryTier())
    waits: list[float] = []
    tier = RetryingTier(faulty, attempts=4, sleep=waits.append)
    faulty.fail_next = 3
    tier.put("k", b"v")
    assert tier.get("k") == b"v"
    assert len(waits) == 3
    assert faulty.calls == 5
    faulty.fail_next = 10
    with pytest.raises(TierUnavailable):
        tier.get("k")
    faulty.fail_next = 0
    calls = faulty.calls
    with pytest.raises(ObjectNotFound):
        tier.get("absent")
    assert faulty.calls == calls + 1  # a miss is not retried


def test_faulty_tier_flips_bits_on_read() -> None:
    faulty = FaultyTier(MemoryTier())
    faulty.put("k", b"abcdef")
    faulty.corrupt_reads = True
    assert faulty.get("k") != b"abcdef"
    assert faulty.get_range("k", 0, 6) != b"abcdef"
