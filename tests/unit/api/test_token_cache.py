"""A token verified once is not hashed again, but expiry, revocation and rotation still hold
at the next request (api/auth.py `TokenCache`)."""

from __future__ import annotations

import hashlib

import pytest

from checkpoint_vault.api.auth import TokenCache
from checkpoint_vault.api.errors import Unauthorized
from checkpoint_vault.vault import Token
from checkpoint_vault.vault.clock import FakeClock


def _token(secret: str, expires_at: float | None = None) -> Token:
    digest = hashlib.sha256(secret.encode()).hexdigest()
    return Token("agent", "k1", digest, ("write:agents/*",), 0.0, expires_at)


def test_a_verified_token_is_refused_once_revoked_rotated_or_expired() -> None:
    clock = FakeClock()
    cache = TokenCache([_token("s1", expires_at=clock.now() + 60)], clock)
    assert cache.authenticate("Bearer ckpt_k1_s1").name == "agent"
    assert cache.authenticate("Bearer ckpt_k1_s1").scopes == ("write:agents/*",)
    with pytest.raises(Unauthorized):
        cache.authenticate("Bearer ckpt_k1_s2")  # the right key id, a wrong secret
    clock.advance(60)
    with pytest.raises(Unauthorized, match="expired"):
        cache.authenticate("Bearer ckpt_k1_s1")
    cache.reload([_token("s2")])  # rotated: the old secret no longer verifies
    with pytest.raises(Unauthorized, match="revoked"):
        cache.authenticate("Bearer ckpt_k1_s1")
    assert cache.authenticate("Bearer ckpt_k1_s2").name == "agent"
    cache.reload([])  # revoked
    with pytest.raises(Unauthorized, match="revoked"):
        cache.authenticate("Bearer ckpt_k1_s2")
