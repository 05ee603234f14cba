"""A cluster's tokens: every primary's token table mirrored through the object store.

`tokens/<key id>.json` holds a token as its catalog stores it (the secret's SHA-256, never
the secret), or `{"revoked": true}` once revoked anywhere: the tombstone stays, so a node
that was down when it came still drops the token and never publishes it again. Each
primary syncs once per beat: what it made is published, what others made is adopted,
what was revoked anywhere is dropped; a token it had seen in the store and no longer holds
was revoked here and gets its tombstone. A rotation shortens the old secret's expiry: the
earlier expiry wins in both directions. So a token works on every node, and a revoked one
fails on every node, within about one beat interval plus one sync (tests: within 5 s).
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from typing import Any, Protocol

from checkpoint_vault.vault.errors import ObjectNotFound
from checkpoint_vault.vault.tier import Tier
from checkpoint_vault.vault.tokens import Token

TOKENS = "tokens/"


class TokenTable(Protocol):
    def all(self) -> list[Token]: ...
    def adopt(self, token: Token) -> None: ...
    def forget(self, key_id: str) -> None: ...


def _encode(token: Token) -> bytes:
    d = asdict(token)
    d.pop("last_used")  # each node's own figure
    return json.dumps(d, sort_keys=True).encode()


def _decode(raw: bytes) -> Token | None:
    d: dict[str, Any] = json.loads(raw)
    if d.get("revoked"):
        return None
    d["scopes"] = tuple(d["scopes"])
    return Token(**d)


def _same(a: Token, b: Token) -> bool:
    return replace(a, last_used=None) == replace(b, last_used=None)


class TokenMirror:
    def __init__(self, tier: Tier, table: TokenTable) -> None:
        self._tier = tier
        self._table = table
        self._known: set[str] = set()  # key ids this process saw in the store

    def sync(self) -> bool:
        """One round (blocking); whether the local table changed."""
        stored: dict[str, Token | None] = {}
        for key in self._tier.list(TOKENS):
            key_id = key[len(TOKENS) :].removesuffix(".json")
            try:
                stored[key_id] = _decode(self._tier.get(key))
            except ObjectNotFound:
                continue
        local = {t.key_id: t for t in self._table.all()}
        changed = False
        for key_id, token in stored.items():
            changed = self._apply(key_id, token, local.get(key_id)) or changed
            self._known.add(key_id)
        for key_id, mine in local.items():
            if key_id not in stored:
                self._publish(mine)
                self._known.add(key_id)
        return changed

    def _apply(self, key_id: str, token: Token | None, mine: Token | None) -> bool:
        """Bring one stored token and ours together; whether ours changed."""
        if token is None:  # revoked somewhere
            if mine is None:
                return False
            self._table.forget(key_id)
            return True
        if mine is None:
            if key_id in self._known:  # we had it, and it went here: revoked here
                self._revoke(key_id)
                return False
            self._table.adopt(token)
            return True
        if _same(mine, token):
            return False
        merged = replace(_earlier(mine, token), last_used=mine.last_used)
        if not _same(merged, token):
            self._publish(merged)
        if _same(merged, mine):
            return False
        self._table.adopt(merged)
        return True

    def _publish(self, token: Token) -> None:
        self._tier.put(f"{TOKENS}{token.key_id}.json", _encode(token))

    def _revoke(self, key_id: str) -> None:
        self._tier.put(f"{TOKENS}{key_id}.json", json.dumps({"revoked": True}).encode())


def _earlier(a: Token, b: Token) -> Token:
    """Of two versions of one token, the one that expires first (a rotation shortened it)."""
    if a.expires_at is None:
        return b
    if b.expires_at is None:
        return a
    return a if a.expires_at <= b.expires_at else b
