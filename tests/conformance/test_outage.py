"""An object store that goes away answers `TierUnavailable` (never not-found) within
seconds, and everything it held reads again once it is back; a tiering run it dies under
leaves every chunk readable somewhere and finishes when run again."""

from __future__ import annotations

import random
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from checkpoint_vault.tiering import open_tier
from checkpoint_vault.vault import FakeClock, Vault, VaultConfig
from checkpoint_vault.vault.errors import TierUnavailable
from checkpoint_vault.vault.tier import Tier

from ..seaweed import SeaweedFS
from ..unit.vault.helpers import read_file, stream_save

pytestmark = pytest.mark.slow  # every test here takes over a second (the quick loop skips them)


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


class _StopsAfter:
    """The real tier, whose server is killed right after its n-th pack upload."""

    def __init__(self, tier: Tier, uploads: int, stop: Callable[[], None]) -> None:
        self.name = tier.name
        self._tier = tier
        self._left = uploads
        self._stop = stop

    def put(self, key: str, data: bytes | memoryview, *, if_absent: bool = False) -> None:
        self._tier.put(key, data, if_absent=if_absent)
        if key.endswith(".idx"):
            self._left -= 1
            if self._left == 0:
                self._stop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tier, name)


def test_store_stopped_mid_run_then_restarted(seaweed: SeaweedFS, tmp_path: Path) -> None:
    server = seaweed
    real = open_tier("cold", f"s3://vault/midrun-{secrets.token_hex(4)}", server.options())
    vault = Vault(
        tmp_path / "v",
        VaultConfig(gc_grace=0.0),
        FakeClock(),
        {"cold": _StopsAfter(real, 2, server.kill)},
    )
    try:
        data = random.Random(12).randbytes(1_500_000)
        rec = stream_save(vault, "ns", {"w": data})
        _, files = vault.manifest("ns", rec.id)
        chunks = [c for c, _ in files["w"].chunks]
        with pytest.raises(TierUnavailable):
            vault.content.demote("cold", chunks, pack_target=300_000)
        tiers = vault.stats().tiers
        assert 0 < tiers["cold"].chunks < len(set(chunks))  # two packs switched, no more
        assert vault.check().ok
        with pytest.raises(TierUnavailable):
            read_file(vault, "ns", rec.id, "w")  # part of it is in the stopped store
        server.start()
        assert read_file(vault, "ns", rec.id, "w") == data
        vault.content.demote("cold", chunks, pack_target=300_000)  # the rerun finishes the move
        assert vault.stats().tiers["hot"].chunks == 0
        assert read_file(vault, "ns", rec.id, "w") == data
        assert vault.check().ok
    finally:
        vault.close()
        if not server.running():
            server.start()
