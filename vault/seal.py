"""Encryption at rest: what leaves the machine is sealed with AES-256-GCM.

The threat is the object store (its operator, a leaked bucket, a stolen backup), not this
host: LMDB stays plaintext (use disk encryption for it) and everything written to a warm or
cold tier is sealed, namely pack frames, pack indexes (they list chunk ids) and catalog
backups (they hold manifests and inline frames). Pack names are random, so no object name
says anything about what it holds.

Keys live in a key file, one `<id> <64 hex digits>` per line; the last line seals new data
and every listed key opens old data, so a key rotates by appending a new line and, once
repacking has re-sealed everything under it, removing the old one. Each sealed item carries
its key id and a random 96-bit nonce; the associated data binds it to where it belongs (a
frame to its chunk id, an index to its pack), so swapping sealed items around is detected
like any flipped byte.
"""

from __future__ import annotations

import os
import secrets
import stat
import struct
from collections.abc import Mapping
from pathlib import Path

import blake3
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .errors import InvalidRequest, KeyUnavailable, SealBroken

KEY_BYTES = 32
NONCE_BYTES = 12
BLOB_MAGIC = b"CVE1"
_KEY_ID = struct.Struct("<H")
_BLOB_HEAD = struct.Struct("<4sH")
MAX_KEY_ID = 0xFFFF


class Keyring:
    """The keys of one key file: `active` seals, all open."""

    def __init__(self, keys: Mapping[int, bytes], active: int) -> None:
        if active not in keys:
            raise InvalidRequest(f"key {active} is not in the key ring")
        self._ciphers = {kid: AESGCM(key) for kid, key in keys.items()}
        self.active = active
        self.key_ids = frozenset(keys)
        self.check_values = {
            kid: blake3.blake3(b"ckpt key check", key=key).digest()[:16]
            for kid, key in keys.items()
        }

    def unknown_to(self, known: Mapping[int, bytes]) -> dict[int, bytes]:
        """Check values of keys a vault has not seen yet; raises if a key id it has seen
        now names a different key. A wrong key would otherwise look exactly like tampering
        and flag every cold chunk damaged."""
        for kid, check in self.check_values.items():
            if kid in known and known[kid] != check:
                raise InvalidRequest(
                    f"key file: key {kid} is not the key {kid} this vault sealed data with"
                )
        return {k: v for k, v in self.check_values.items() if k not in known}

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Keyring:
        """Read a key file; refuse one that others may read, since it opens everything."""
        p = Path(path)
        try:
            mode = p.stat().st_mode
            text = p.read_text()
        except OSError as e:
            raise InvalidRequest(f"key file {p}: {e.strerror}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise InvalidRequest(f"key file {p}: readable by others; chmod 600 it")
        keys: dict[int, bytes] = {}
        active = None
        for n, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            kid, key = _parse_line(p, n, line)
            if kid in keys:
                raise InvalidRequest(f"key file {p}, line {n}: key id {kid} appears twice")
            keys[kid] = key
            active = kid
        if active is None:
            raise InvalidRequest(f"key file {p}: no keys")
        return cls(keys, active)

    def seal(self, plain: bytes | memoryview, aad: bytes) -> bytes:
        """Key id (2 bytes), nonce (12), ciphertext with its 16-byte tag."""
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._ciphers[self.active].encrypt(nonce, bytes(plain), aad)
        return b"".join((_KEY_ID.pack(self.active), nonce, sealed))

    def open(self, sealed: bytes | memoryview, aad: bytes) -> bytes:
        """The plaintext; SealBroken if anything was changed, KeyUnavailable if the key that
        sealed it is not in this ring (an operator error, not damage)."""
        view = memoryview(sealed)
        if len(view) < _KEY_ID.size + NONCE_BYTES + 16:
            raise SealBroken("sealed data is truncated")
        (kid,) = _KEY_ID.unpack_from(view)
        cipher = self._ciphers.get(kid)
        if cipher is None:
            raise KeyUnavailable(f"data is sealed with key {kid}, which the key file lacks")
        nonce = view[_KEY_ID.size : _KEY_ID.size + NONCE_BYTES]
        try:
            return cipher.decrypt(bytes(nonce), bytes(view[_KEY_ID.size + NONCE_BYTES :]), aad)
        except InvalidTag:
            raise SealBroken("sealed data failed authentication") from None

    def seal_blob(self, plain: bytes, aad: bytes) -> bytes:
        """A whole object (index, catalog backup), marked so a reader knows it is sealed."""
        return BLOB_MAGIC + self.seal(plain, aad)


def is_sealed_blob(raw: bytes) -> bool:
    return raw[: len(BLOB_MAGIC)] == BLOB_MAGIC


def open_blob(keyring: Keyring | None, raw: bytes, aad: bytes) -> bytes:
    """An object as written: sealed ones need the ring, plain ones pass through."""
    if not is_sealed_blob(raw):
        return raw
    if keyring is None:
        raise KeyUnavailable("the object is encrypted and no key file is configured")
    return keyring.open(memoryview(raw)[len(BLOB_MAGIC) :], aad)


def new_key_line(ids: frozenset[int] = frozenset()) -> str:
    """A fresh key for a key file, numbered after the highest id in use."""
    kid = max(ids, default=0) + 1
    if kid > MAX_KEY_ID:
        raise InvalidRequest("key ids are exhausted")
    return f"{kid} {secrets.token_hex(KEY_BYTES)}\n"


def add_key(path: str | os.PathLike[str]) -> int:
    """Append a new active key to a key file, creating it (mode 600) if needed."""
    p = Path(path)
    line = new_key_line(Keyring.load(p).key_ids if p.exists() else frozenset())
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return int(line.split()[0])


def _parse_line(path: Path, n: int, line: str) -> tuple[int, bytes]:
    parts = line.split()
    if len(parts) != 2 or not parts[0].isdigit():
        raise InvalidRequest(f"key file {path}, line {n}: expected '<id> <64 hex digits>'")
    kid = int(parts[0])
    try:
        key = bytes.fromhex(parts[1])
    except ValueError:
        key = b""
    if not 1 <= kid <= MAX_KEY_ID or len(key) != KEY_BYTES:
        raise InvalidRequest(
            f"key file {path}, line {n}: id must be 1..{MAX_KEY_ID}, key 64 hex digits"
        )
    return kid, key
