"""Chunk content: where each chunk's frame lives, the pack format, the one read path, and
every move between locations. Tiering goes through `Mover` (`Vault.content`), the rest of
the engine through `Chunks` and `Reader`, never through the tables behind a location.

| module | owns |
|---|---|
| `location.py` | `HotFrame`, `Inline`, `Packed`: a chunk's location as a type |
| `chunks.py` | chunk metadata, reference counts, storing and healing, location switches |
| `packs.py` | pack objects and their indexes: build, upload, ranged reads, delete |
| `reader.py` | the one read path: find, fetch (coalesced pack reads), verify, flag damaged |
| `moves.py` | demote, promote, move between packs, pack usage, deleting unreferenced packs |
| `shared.py` | the cluster's shared chunk index: immutable segments in the shared tier |
| `sharedgc.py` | GC of the shared tier across nodes: marks, condemned packs, the sweep |
| `parts.py` | what this package needs of the store (a Protocol; the store is never imported) |
"""

from .location import HotFrame, Inline, Location, Packed
from .moves import Mover, MoveReport, PackUsage
from .packs import PACK_TARGET
from .shared import SharedEntry, SharedIndex

__all__ = [
    "PACK_TARGET",
    "HotFrame",
    "Inline",
    "Location",
    "MoveReport",
    "Mover",
    "PackUsage",
    "Packed",
    "SharedEntry",
    "SharedIndex",
]
