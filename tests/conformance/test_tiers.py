"""Every tier backend keeps the same promises (see vault/tier.py)."""

from __future__ import annotations

import os
import secrets

import pytest

from checkpoint_vault.tiering import open_tier
from checkpoint_vault.vault.errors import InvalidName, ObjectExists, ObjectNotFound
from checkpoint_vault.vault.tier import Tier

from ..seaweed import SeaweedFS


def test_put_get_head_delete(tier: Tier) -> None:
    data = os.urandom(300_000)
    tier.put("packs/ab/pack-1", data)
    assert tier.get("packs/ab/pack-1") == data
    assert tier.head("packs/ab/pack-1") == len(data)
    tier.put("packs/ab/pack-1", b"replaced")
    assert tier.get("packs/ab/pack-1") == b"replaced"
    tier.delete("packs/ab/pack-1")
    assert tier.head("packs/ab/pack-1") is None
    with pytest.raises(ObjectNotFound):
        tier.get("packs/ab/pack-1")
    tier.delete("packs/ab/pack-1")  # idempotent


def test_ranges(tier: Tier) -> None:
    data = bytes(range(256)) * 1000
    tier.put("r", data)
    assert tier.get_range("r", 0, 10) == data[:10]
    assert tier.get_range("r", 1000, 5000) == data[1000:6000]
    assert tier.get_range("r", len(data) - 3, 100) == data[-3:]
    assert tier.get_range("r", len(data) + 5, 10) == b""
    with pytest.raises(ObjectNotFound):
        tier.get_range("absent", 0, 10)


def test_conditional_create(tier: Tier) -> None:
    tier.put("index/1", b"first", if_absent=True)
    with pytest.raises(ObjectExists):
        tier.put("index/1", b"second", if_absent=True)
    assert tier.get("index/1") == b"first"


def test_list_by_prefix(tier: Tier) -> None:
    for key in ("a/1", "a/2", "b/1"):
        tier.put(key, key.encode())
    assert sorted(tier.list("a/")) == ["a/1", "a/2"]
    assert sorted(k for k in tier.list() if k in {"a/1", "a/2", "b/1"}) == ["a/1", "a/2", "b/1"]


@pytest.mark.parametrize("key", ["../etc/passwd", "/abs", "UPPER", "a//b", "a/../b", "", "x" * 600])
def test_keys_are_validated_at_the_boundary(tier: Tier, key: str) -> None:
    with pytest.raises(InvalidName):
        tier.put(key, b"x")


def test_a_bucket_that_does_not_exist(seaweed: SeaweedFS) -> None:
    """Nothing is listed and nothing read: not an outage to retry (SeaweedFS makes the
    bucket on the first put)."""
    tier = open_tier("cold", f"s3://nobucket-{secrets.token_hex(4)}/p", seaweed.options())
    assert list(tier.list("packs/")) == []
    with pytest.raises(ObjectNotFound):
        tier.get("packs/x")
