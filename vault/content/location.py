"""Where a chunk's frame lives: a type per place, not a sentinel in an integer field.

- `HotFrame`: in the frame environment, under its sequence number (the hot tier).
- `Inline`: in the catalog environment beside its metadata (chunks of one-request saves,
  so such a save commits one environment, not two).
- `Packed`: at a byte range of a pack object in another tier.

On disk the metadata record still carries one u64 (`_SEQ_INLINE`, `_SEQ_PACKED` or a frame
sequence number) and packed chunks a row in the `packed` table; only `vault/content/chunks.py`
reads or writes that encoding.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_PACKED = struct.Struct("<QIH")  # offset, length, tier-name length; then name, then key


@dataclass(frozen=True, slots=True)
class HotFrame:
    seq: int  # key of the frame in the frame environment


@dataclass(frozen=True, slots=True)
class Inline:
    pass


@dataclass(frozen=True, slots=True)
class Packed:
    tier: str
    key: str  # the pack object's key in that tier
    offset: int
    length: int

    def encode(self) -> bytes:
        name = self.tier.encode()
        return _PACKED.pack(self.offset, self.length, len(name)) + name + self.key.encode()

    @classmethod
    def decode(cls, raw: bytes | memoryview) -> Packed:
        offset, length, n = _PACKED.unpack_from(raw)
        rest = bytes(raw[_PACKED.size :])
        return cls(rest[:n].decode(), rest[n:].decode(), offset, length)


INLINE = Inline()
Location = HotFrame | Inline | Packed
