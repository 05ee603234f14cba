"""Identifiers: time-sortable checkpoint ids and random upload ids.

Checkpoint ids are ULID-shaped (48-bit millisecond time + 80 random bits, Crockford base32,
26 characters) so that sorting ids sorts by commit time; `IdGenerator` keeps them strictly
increasing even when two commits share a millisecond, which makes "newest first" a plain
reverse key scan.
"""

from __future__ import annotations

import secrets
import threading

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_RANDOM_BITS = 80


def _encode(value: int) -> str:
    out = []
    for _ in range(26):
        out.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))


def _decode(checkpoint_id: str) -> int:
    value = 0
    for ch in checkpoint_id:
        value = value * 32 + _ALPHABET.index(ch)
    return value


def timestamp_ms(checkpoint_id: str) -> int:
    """The millisecond Unix time encoded in a checkpoint id."""
    return _decode(checkpoint_id) >> _RANDOM_BITS


class IdGenerator:
    """Monotonic ULID source; one per open vault."""

    def __init__(self, newest: str | None = None) -> None:
        """`newest`: the largest id already issued, so that a clock that stepped back
        across a restart still cannot produce an id that sorts before it."""
        self._lock = threading.Lock()
        self._last = _decode(newest) if newest else 0

    def next(self, now_ms: int) -> str:
        with self._lock:
            value = (now_ms << _RANDOM_BITS) | secrets.randbits(_RANDOM_BITS)
            if value <= self._last:
                value = self._last + 1
            self._last = value
            return _encode(value)

    def follow(self, issued: str) -> None:
        """Never issue `issued` or an id before it (a save applied again from the journal
        keeps the id it was given before a crash)."""
        with self._lock:
            self._last = max(self._last, _decode(issued))


def new_upload_id() -> str:
    return secrets.token_hex(16)
