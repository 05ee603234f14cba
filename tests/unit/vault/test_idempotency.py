"""Idempotency keys per token (vault/idempotency.py): one key is another entry for another
token, and an entry from before keys were scoped counts only for the token that made it."""

from __future__ import annotations

import struct

import blake3
import pytest

from checkpoint_vault.vault import Conflict, FakeClock, Vault


def test_the_same_key_is_each_tokens_own(vault: Vault) -> None:
    key = "k" * 20
    a, _ = vault.save("ns-a", {"s": b"a"}, key=key, by="a")
    b, created = vault.save("ns-b", {"s": b"b"}, key=key, by="b")
    assert created
    assert b.id != a.id
    assert vault.save("ns-a", {"s": b"again"}, key=key, by="a") == (a, False)
    with pytest.raises(Conflict):  # the same token reusing its key elsewhere
        vault.save("ns-c", {"s": b"c"}, key=key, by="a")


def test_an_unscoped_entry_counts_for_its_own_token_only(vault: Vault, clock: FakeClock) -> None:
    """What a version that did not scope keys stored: the key's BLAKE3 -> expiry, id."""
    first, _ = vault.save("ns-a", {"s": b"a"}, by="a")
    key = "u" * 20
    s = vault.store
    entry = struct.pack("<d", clock.now() + 60) + first.id.encode()
    stored = blake3.blake3(key.encode()).digest()[:16]
    s.writer.run(lambda w: w.catalog.put(stored, entry, db=s.catalog_env.db["idempotency"]))
    assert vault.save("ns-a", {"s": b"retry"}, key=key, by="a") == (first, False)
    other, created = vault.save("ns-b", {"s": b"b"}, key=key, by="b")
    assert (created, other.namespace) == (True, "ns-b")
