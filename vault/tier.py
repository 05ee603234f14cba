"""The tier interface: what the engine needs from a place chunks can live besides LMDB.

Declared here, by its consumer; tiering/backends implement it. Semantics every backend
keeps:
- Keys are validated at the boundary (`check_key`): lowercase ASCII, digits, `/._-`, no
  empty or `..` segment, at most 512 bytes. Nothing else reaches a filesystem or a bucket.
- `put` is atomic: a reader sees the old object (or none) or the whole new one, never part.
  With `if_absent=True` it raises `ObjectExists` instead of replacing (conditional create,
  never exists-then-put).
- Read-after-write: a `get` after `put` returns sets the new bytes.
- `get_range` returns exactly `length` bytes, or fewer only at the end of the object; a
  start past the end returns b"".
- `delete` is idempotent: deleting a missing key succeeds.
- `list` yields keys under a prefix in no particular order; it is not a snapshot.
- Errors: `ObjectNotFound` (no such key), `TierUnavailable` (down or unreachable: retry
  later), `TierError` (anything else). Provider messages, paths, bucket names and
  credentials stay out of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from .errors import InvalidName, TierError

_KEY = re.compile(r"[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)*")
MAX_KEY = 512


def check_key(key: str) -> str:
    if len(key) > MAX_KEY or not _KEY.fullmatch(key) or "/../" in f"/{key}/":
        raise InvalidName(f"invalid tier key {key[:80]!r}")
    return key


class Tier(Protocol):
    name: str

    def put(self, key: str, data: bytes | memoryview, *, if_absent: bool = False) -> None: ...

    def get(self, key: str) -> bytes: ...

    def get_range(self, key: str, start: int, length: int) -> bytes: ...

    def head(self, key: str) -> int | None:
        """The object's size, or None if there is none."""
        ...

    def delete(self, key: str) -> None: ...

    def list(self, prefix: str = "") -> Iterator[str]: ...


@runtime_checkable
class DatedTier(Tier, Protocol):
    """A tier that tells when the store wrote an object, by the store's own clock (S3's
    Last-Modified): what a protocol between nodes measures time in, since no two nodes'
    clocks are ever compared (vault/content/sharedgc.py). Every backend offers it."""

    def modified(self, key: str) -> float | None:
        """Seconds since the epoch, by the store's clock, of the object's last write; None
        if there is none. Some stores keep whole seconds only."""
        ...


def modified(tier: Tier, key: str) -> float | None:
    """`tier.modified(key)`, or `TierError` for a tier that cannot tell."""
    if not isinstance(tier, DatedTier):
        raise TierError(f"tier {tier.name}: keeps no modification times")
    return tier.modified(key)
