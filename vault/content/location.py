"""Where a chunk's frame lives: a type per place, not a sentinel in an integer field.

- `HotFrame`: in the frame environment, under its sequence number (the hot tier).
- `Inline`: in the catalog environment beside its metadata (chunks of one-request saves,
  so such a save commits one environment, not two), under a sequence number drawn from the
  frames' numbering: appended, the table's pages fill up (keyed by the random chunk id
  they were ~60% full). Sequence 0 is a chunk stored before that, keyed by its id.
- `Packed`: at a byte range of a pack object in another tier.

On disk the metadata record still carries one u64 (a frame sequence number, one with the
inline bit, or `_SEQ_PACKED`) and packed chunks a row in the `packed` table; only
`vault/content/chunks.py` reads or writes that encoding.
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
    seq: int  # key of the frame in the catalog's inline table (0: keyed by the chunk id)


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


Location = HotFrame | Inline | Packed
