"""API tokens: only a hash of each secret is stored.

A token reads `ckpt_<key id>_<secret>`. The key id finds the record; the secret is compared
by its SHA-256 with `hmac.compare_digest`, so lookups do not leak the secret through timing
and a stolen catalog does not yield usable tokens. Secrets carry 256 bits of entropy, so a
plain hash (not a password KDF) is enough.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Protocol

from checkpoint_vault.protocol import TokenRecord

from .errors import Conflict, InvalidName, InvalidRequest, NotFound
from .writer import WriteTxn

if TYPE_CHECKING:
    from .clock import Clock
    from .counters import Counters
    from .env import Env
    from .writer import Writer


class TokenParts(Protocol):
    """What the token table needs of the store: its catalog, counters, clock and writer."""

    @property
    def catalog_env(self) -> Env: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def counters(self) -> Counters: ...
    @property
    def writer(self) -> Writer: ...


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SCOPE = re.compile(r"admin|metrics|(read|write|delete):[A-Za-z0-9._:/*?\[\]-]{1,300}")


@dataclass(frozen=True)
class Token:
    name: str
    key_id: str
    secret_hash: str
    scopes: tuple[str, ...]
    created_at: float
    expires_at: float | None = None  # refused from then on (401); None: never
    last_used: float | None = None  # as last flushed from the server's memory

    def to_record(self) -> TokenRecord:
        """The token as the admin routes show it: never its secret or key id."""
        return TokenRecord(
            self.name, list(self.scopes), self.created_at, self.expires_at, self.last_used
        )

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def check_scopes(scopes: object) -> tuple[str, ...]:
    if (
        not isinstance(scopes, list)
        or not scopes
        or not all(isinstance(s, str) and _SCOPE.fullmatch(s) for s in scopes)
    ):
        raise InvalidRequest(
            "scopes must be a non-empty list of 'admin', 'metrics', 'read:<glob>', "
            "'write:<glob>' or 'delete:<glob>'"
        )
    return tuple(scopes)


def scope_warnings(scopes: tuple[str, ...]) -> list[str]:
    """Globs that match more than they seem to. fnmatch's `*` crosses `/` and a wildcard
    inside a segment matches any name sharing its prefix: `read:ns-a*` also grants
    `ns-archive/...`. Whole-segment wildcards (`ns-a/*`) say what they mean; the others are
    accepted (existing tokens keep working) with a warning naming the trap. A whole-segment
    `*` before other segments is such a trap too: `read:*/secret` grants `x/y/secret`."""
    out = []
    for scope in scopes:
        action, _, glob = scope.partition(":")
        if not glob:
            continue
        segments = glob.split("/")
        for i, segment in enumerate(segments):
            if any(c in segment for c in "*?[") and segment != "*":
                out.append(
                    f"{scope!r}: the wildcard in {segment!r} matches other names with that "
                    f"prefix and crosses '/' (e.g. {action}:ns-a* grants ns-archive/x); for "
                    f"a namespace and its children use '{action}:ns-a' plus '{action}:ns-a/*'"
                )
                break
            if segment == "*" and i < len(segments) - 1:
                before, after = segments[:i], segments[i + 1 :]
                deep, meant = (
                    "/".join([*before, "x", "y", *after]),
                    "/".join([*before, "x", *after]),
                )
                out.append(
                    f"{scope!r}: '*' crosses '/', so it matches more than one level: it "
                    f"grants {deep} as well as {meant}; name each namespace in its place "
                    f"to grant only those"
                )
                break
    return out


TOKEN_CHANGES = "token_changes"  # counter: changes of the token table (`Tokens.changes`)


class Tokens:
    def __init__(self, store: TokenParts) -> None:
        self._s = store
        self._db = store.catalog_env.db["tokens"]

    def all(self) -> list[Token]:
        with self._s.catalog_env.read() as txn:
            return [self._decode(v) for _, v in txn.cursor(db=self._db)]

    def create(
        self, name: object, scopes: object, expires_in: float | None = None
    ) -> tuple[Token, str]:
        """Store a new token; the secret is returned once and never again. `expires_in`:
        seconds until it stops working (None: never)."""
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidName("token name must match [A-Za-z0-9][A-Za-z0-9._-]{0,63}")
        checked = check_scopes(scopes)
        if expires_in is not None and expires_in <= 0:
            raise InvalidRequest("expires must be a positive duration")
        key_id = secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        now = self._s.clock.now()
        expires = now + expires_in if expires_in is not None else None
        token = Token(name, key_id, _digest(secret), checked, now, expires)

        def op(w: WriteTxn) -> None:
            txn = w.catalog
            if any(self._decode(v).name == name for _, v in txn.cursor(db=self._db)):
                raise Conflict(f"a token named {name!r} exists; revoke it first")
            txn.put(key_id.encode(), _encode(token), db=self._db)
            self._changed(w)

        self._s.writer.run(op)
        return token, f"ckpt_{key_id}_{secret}"

    def revoke(self, name: str) -> None:
        """Delete every secret of the token `name` (a rotated one has two for a while)."""

        def op(w: WriteTxn) -> None:
            keys = [
                bytes(k) for k, v in w.catalog.cursor(db=self._db) if self._decode(v).name == name
            ]
            if not keys:
                raise NotFound(f"no token named {name!r}")
            for key in keys:
                w.catalog.delete(key, db=self._db)
            self._changed(w)

        self._s.writer.run(op)

    def rotate(self, name: str, grace: float) -> tuple[Token, str]:
        """A new secret for token `name` (same name, so same scopes and ownership of the
        checkpoints it made); its current secret keeps working for `grace` seconds, so
        producers can be switched over without downtime."""
        if grace < 0:
            raise InvalidRequest("grace must not be negative")
        secret = secrets.token_urlsafe(32)

        def op(w: WriteTxn) -> Token:
            txn = w.catalog
            now = self._s.clock.now()
            current = [(bytes(k), self._decode(v)) for k, v in txn.cursor(db=self._db)]
            mine = [(k, t) for k, t in current if t.name == name and not t.expired(now)]
            if not mine:
                raise NotFound(f"no live token named {name!r}")
            for key, old in mine:
                ends = now + grace if old.expires_at is None else min(old.expires_at, now + grace)
                txn.put(key, _encode(replace(old, expires_at=ends)), db=self._db)
            newest = max((t for _, t in mine), key=lambda t: t.created_at)
            token = Token(
                name, secrets.token_hex(8), _digest(secret), newest.scopes, now, newest.expires_at
            )
            txn.put(token.key_id.encode(), _encode(token), db=self._db)
            self._changed(w)
            return token

        token = self._s.writer.run(op)
        return token, f"ckpt_{token.key_id}_{secret}"

    def adopt(self, token: Token) -> None:
        """Store `token` as another node made or changed it (a cluster's tokens are mirrored
        through its object store, cluster/tokens.py): by key id, whatever its name."""

        def op(w: WriteTxn) -> None:
            w.catalog.put(token.key_id.encode(), _encode(token), db=self._db)
            self._changed(w)

        self._s.writer.run(op)

    def forget(self, key_id: str) -> None:
        """Drop the secret `key_id` (revoked on another node of a cluster); no error if
        it is not here."""

        def op(w: WriteTxn) -> None:
            if w.catalog.delete(key_id.encode(), db=self._db):
                self._changed(w)

        self._s.writer.run(op)

    def changes(self) -> int:
        """How many times the token table changed (created, revoked, rotated): a process
        that reads the data dir beside the one that writes it (a worker) reloads its copy
        of the tokens when this moves, so a revocation holds on every worker at once."""
        with self._s.catalog_env.read() as txn:
            return self._s.counters.get(txn, TOKEN_CHANGES)

    def _changed(self, w: WriteTxn) -> None:
        self._s.counters.add(w.catalog, TOKEN_CHANGES, 1)

    def record_use(self, last_used: dict[str, float]) -> None:
        """Store when each token (by key id) was last used, as the server saw it."""

        def op(w: WriteTxn) -> None:
            for key_id, at in last_used.items():
                raw = w.catalog.get(key_id.encode(), db=self._db)
                if raw is not None:
                    token = replace(self._decode(raw), last_used=at)
                    w.catalog.put(key_id.encode(), _encode(token), db=self._db)

        if last_used and self._s.writer.refusal() is None:  # a read-only vault forgets them
            self._s.writer.run(op)

    @staticmethod
    def _decode(raw: bytes | memoryview) -> Token:
        d = json.loads(bytes(raw))
        d["scopes"] = tuple(d["scopes"])
        return Token(**d)


def _encode(token: Token) -> bytes:
    return json.dumps(asdict(token)).encode()


def verify(tokens: dict[str, Token], presented: str) -> Token | None:
    """The token `presented` names, if its secret matches; `tokens` is keyed by key id."""
    parts = presented.split("_", 2)
    if len(parts) != 3 or parts[0] != "ckpt":
        return None
    token = tokens.get(parts[1])
    if token is None:
        return None
    return token if hmac.compare_digest(token.secret_hash, _digest(parts[2])) else None
