"""An object store that goes away answers `TierUnavailable` (never not-found) within
seconds, and everything it held reads again once it is back."""

from __future__ import annotations

import time

import pytest

from tiering import open_tier
from vault.errors import TierUnavailable

from ..seaweed import SeaweedFS


def test_outage_is_unavailable_then_recovers(seaweed: SeaweedFS) -> None:
    server = seaweed  # the shared one, killed and restarted: two at once do not start cleanly
    try:
        tier = open_tier("cold", "s3://vault/outage", server.options())
        tier.put("packs/p1", b"kept across the outage")
        server.kill()
        started = time.monotonic()
        for call in (
            lambda: tier.get("packs/p1"),
            lambda: tier.put("packs/p2", b"x"),
            lambda: tier.get_range("packs/p1", 0, 4),
            lambda: list(tier.list()),
        ):
            with pytest.raises(TierUnavailable):
                call()
        assert time.monotonic() - started < 60
        server.start()
        assert tier.get("packs/p1") == b"kept across the outage"
    finally:
        if not server.running():
            server.start()
