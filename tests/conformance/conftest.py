"""The tier conformance suite runs against every backend, including a real SeaweedFS."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from checkpoint_vault.tiering import open_tier
from checkpoint_vault.vault.tier import Tier

from ..seaweed import SeaweedFS


@pytest.fixture(params=["memory", "file", "s3"])
def tier(request: pytest.FixtureRequest, tmp_path: Path) -> Tier:
    if request.param == "memory":
        return open_tier("mem", "memory://")
    if request.param == "file":
        return open_tier("local", f"file://{tmp_path / 'tier'}")
    seaweed: SeaweedFS = request.getfixturevalue("seaweed")
    prefix = secrets.token_hex(4)  # each test its own prefix in one bucket
    return open_tier("cold", f"s3://vault/{prefix}", seaweed.options())
