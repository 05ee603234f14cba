"""Pack files: how chunks live in warm and cold tiers, tens of MiB per object, never one
object per chunk (object stores charge per request and list slowly past millions of keys).

A pack is two objects: `packs/<id>`, the chunk frames back to back, and `packs/<id>.idx`,
its index (chunk id, offset, length per frame), written after the pack so an index never
names a pack that is not whole. Reads fetch one frame by byte range. The catalog keeps each
chunk's (pack, offset, length) for reads; the index object is there to rebuild a catalog
from the tier alone. With encryption on, frames arrive here already sealed and the index is
sealed whole (it lists chunk ids), bound to its pack's id.
"""

from __future__ import annotations

import secrets
import struct
from dataclasses import dataclass, field

from vault.errors import TierError
from vault.seal import Keyring, open_blob
from vault.tier import Tier

PACK_TARGET = 32 << 20  # bytes per pack: ~0.3 s of upload at object-store speeds here
_INDEX_HEAD = struct.Struct("<4sI")
_INDEX_ENTRY = struct.Struct("<32sQI")
_INDEX_MAGIC = b"CVPI"


@dataclass(frozen=True)
class PackEntry:
    chunk: bytes  # 32-byte chunk id
    offset: int
    length: int


@dataclass
class PackBuilder:
    """Collects frames until the pack is big enough to send."""

    target: int = PACK_TARGET
    pack_id: str = field(default_factory=lambda: secrets.token_hex(16))
    _parts: list[bytes] = field(default_factory=list)
    entries: list[PackEntry] = field(default_factory=list)
    size: int = 0

    def add(self, chunk: bytes, frame: bytes) -> None:
        self.entries.append(PackEntry(chunk, self.size, len(frame)))
        self._parts.append(frame)
        self.size += len(frame)

    @property
    def full(self) -> bool:
        return self.size >= self.target

    def body(self) -> bytes:
        return b"".join(self._parts)


def pack_key(pack_id: str) -> str:
    return f"packs/{pack_id}"


def index_key(pack_id: str) -> str:
    return f"packs/{pack_id}.idx"


def encode_index(entries: list[PackEntry]) -> bytes:
    return _INDEX_HEAD.pack(_INDEX_MAGIC, len(entries)) + b"".join(
        _INDEX_ENTRY.pack(e.chunk, e.offset, e.length) for e in entries
    )


def decode_index(raw: bytes) -> list[PackEntry]:
    magic, count = _INDEX_HEAD.unpack_from(raw)
    if magic != _INDEX_MAGIC or len(raw) != _INDEX_HEAD.size + count * _INDEX_ENTRY.size:
        raise TierError("pack index is damaged")
    return [PackEntry(*e) for e in _INDEX_ENTRY.iter_unpack(raw[_INDEX_HEAD.size :])]


def upload(tier: Tier, pack: PackBuilder, keyring: Keyring | None = None) -> None:
    """Store the pack, check the tier holds all of it, then its index (conditional creates:
    a pack id is never reused)."""
    body = pack.body()
    tier.put(pack_key(pack.pack_id), body, if_absent=True)
    stored = tier.head(pack_key(pack.pack_id))
    if stored != len(body):
        raise TierError(f"tier {tier.name}: pack {pack.pack_id} stored {stored} of {len(body)}")
    index = encode_index(pack.entries)
    if keyring is not None:
        index = keyring.seal_blob(index, pack.pack_id.encode())
    tier.put(index_key(pack.pack_id), index, if_absent=True)


def read_frame(tier: Tier, pack_id: str, offset: int, length: int) -> bytes:
    frame = tier.get_range(pack_key(pack_id), offset, length)
    if len(frame) != length:
        raise TierError(f"tier {tier.name}: pack {pack_id} is shorter than its index says")
    return frame


def load_index(tier: Tier, pack_id: str, keyring: Keyring | None = None) -> list[PackEntry]:
    return decode_index(open_blob(keyring, tier.get(index_key(pack_id)), pack_id.encode()))


def delete_pack(tier: Tier, pack_id: str) -> None:
    """Index first: a pack without an index is garbage, an index without a pack a lie."""
    tier.delete(index_key(pack_id))
    tier.delete(pack_key(pack_id))
