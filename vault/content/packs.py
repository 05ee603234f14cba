"""Pack files, written and read: how chunks live in warm and cold tiers, tens of MiB per
object, never one object per chunk (object stores charge per request and list slowly past
millions of keys).

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

from ..errors import ObjectNotFound, TierError
from ..seal import Keyring, open_blob
from ..tier import Tier
from .location import Packed

PACK_TARGET = 32 << 20  # bytes per pack: ~0.3 s of upload at object-store speeds here
PACK_PREFIX = "packs/"
RUN_LIMIT = 16 << 20  # largest single range read from a pack
RUN_GAP = 512 << 10  # unwanted bytes worth reading to save a request (~ms of transfer)
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
    return f"{PACK_PREFIX}{pack_id}"


def index_key(pack_id: str) -> str:
    return f"{PACK_PREFIX}{pack_id}.idx"


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


def read_frames(tier: Tier, wanted: dict[int, Packed]) -> dict[int, bytes | None]:
    """Frames from packs of one tier, one range request per run of nearby frames: the
    chunks of a file were packed in order, so a batch is usually a few requests, not one
    each; small gaps (frames of other files, dead bytes) are read over rather than split on.
    A frame its pack does not hold (gone, or shorter than the index said) is None."""
    out: dict[int, bytes | None] = {}
    by_pack: dict[str, list[tuple[int, int]]] = {}
    for i, where in wanted.items():
        by_pack.setdefault(where.key, []).append((where.offset, i))
    for key, items in by_pack.items():
        items.sort()
        start = 0
        while start < len(items):
            base = items[start][0]
            stop = base + wanted[items[start][1]].length
            end = start + 1
            while end < len(items) and items[end][0] <= stop + RUN_GAP:
                last = items[end][0] + wanted[items[end][1]].length
                if last - base > RUN_LIMIT:
                    break
                stop = max(stop, last)
                end += 1
            try:
                blob = tier.get_range(key, base, stop - base)
            except ObjectNotFound:
                blob = b""
            for offset, i in items[start:end]:
                piece = blob[offset - base : offset - base + wanted[i].length]
                out[i] = piece if len(piece) == wanted[i].length else None
            start = end
    return out


def load_index(tier: Tier, pack_id: str, keyring: Keyring | None = None) -> list[PackEntry]:
    return decode_index(open_blob(keyring, tier.get(index_key(pack_id)), pack_id.encode()))


def delete_pack(tier: Tier, pack_id: str) -> None:
    """Index first: a pack without an index is garbage, an index without a pack a lie."""
    tier.delete(index_key(pack_id))
    tier.delete(pack_key(pack_id))
