"""The tier conformance suite runs against every backend, including a real SeaweedFS."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tiering import open_tier
from vault.tier import Tier

from ..seaweed import SeaweedFS


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    server = SeaweedFS(tmp_path_factory.mktemp("seaweed"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["memory", "file", "s3"])
def tier(request: pytest.FixtureRequest, tmp_path: Path) -> Tier:
    if request.param == "memory":
        return open_tier("mem", "memory://")
    if request.param == "file":
        return open_tier("local", f"file://{tmp_path / 'tier'}")
    seaweed: SeaweedFS = request.getfixturevalue("seaweed")
    prefix = secrets.token_hex(4)  # each test its own prefix in one bucket
    return open_tier("cold", f"s3://vault/{prefix}", seaweed.options())
