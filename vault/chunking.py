"""The server's chunking profiles and how a requested profile is checked.

The chunker itself (`ChunkingProfile`, `StreamChunker`) is the wire protocol's, in
protocol, so server ingest and client saves cut with the same code; this module owns
only what the server decides: the named profiles, the default, and the accepted ranges.
"""

from __future__ import annotations

import io

from checkpoint_vault.protocol import ChunkingProfile, StreamChunker, tensor_regions

from .errors import InvalidRequest

# pyfastcdc's accepted ranges (see its FastCDC docstring).
_MIN_RANGE = (64, 1 << 20)
_AVG_RANGE = (256, 4 << 20)
_MAX_RANGE = (1024, 16 << 20)


# Agent state is re-serialized whole at every step; only small chunks line up with the
# unchanged messages (bench/README.md, "History from DESIGN.md", has the measurements).
SMALL = ChunkingProfile("small", min_size=512, avg_size=1536, max_size=8192)
# Tensors: large chunks keep per-chunk overhead (catalog entry, hash, LMDB page rounding) low,
# and tensors of torch.save and safetensors files are cut in 256 KiB pieces from their start,
# so compaction finds each piece's previous version (protocol/_layout.py).
LARGE = ChunkingProfile(
    "large", min_size=16384, avg_size=49152, max_size=262144, tensor_pieces=262144
)
PROFILES = {p.name: p for p in (SMALL, LARGE)}
DEFAULT_PROFILE = LARGE


def cut_whole(profile: ChunkingProfile, data: bytes) -> list[memoryview]:
    """The chunks of a file held whole in memory, tensors cut as the profile says."""
    if not data:
        return []
    regions = (
        tensor_regions(io.BytesIO(data), len(data), profile.tensor_pieces)
        if profile.tensor_pieces
        else []
    )
    return StreamChunker(profile, regions=regions).feed(data, True)


def profile_from_wire(value: object, max_chunk_size: int) -> ChunkingProfile:
    """Parse a requested profile: a profile name or explicit {min_size, avg_size, max_size}."""
    if isinstance(value, str):
        if value not in PROFILES:
            raise InvalidRequest(f"unknown chunking profile {value!r}; known: {sorted(PROFILES)}")
        return PROFILES[value]
    if not isinstance(value, dict):
        raise InvalidRequest("chunking must be a profile name or {min_size, avg_size, max_size}")
    try:
        lo, avg, hi = (int(value[k]) for k in ("min_size", "avg_size", "max_size"))
        pieces = int(value.get("tensor_pieces", 0))
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidRequest("chunking needs integer min_size, avg_size and max_size") from e
    if pieces and not lo <= pieces <= max_chunk_size:
        raise InvalidRequest(
            f"tensor_pieces must be 0 (off) or between min_size and {max_chunk_size}"
        )
    ok = (
        _MIN_RANGE[0] <= lo <= _MIN_RANGE[1]
        and _AVG_RANGE[0] <= avg <= _AVG_RANGE[1]
        and _MAX_RANGE[0] <= hi <= min(_MAX_RANGE[1], max_chunk_size)
        and lo <= avg <= hi
    )
    if not ok:
        raise InvalidRequest(
            f"chunking sizes out of range: need {_MIN_RANGE[0]}<=min<=avg<=max<="
            f"{min(_MAX_RANGE[1], max_chunk_size)}"
        )
    return ChunkingProfile("custom", lo, avg, hi, pieces)


__all__ = [
    "DEFAULT_PROFILE",
    "LARGE",
    "PROFILES",
    "SMALL",
    "ChunkingProfile",
    "StreamChunker",
    "cut_whole",
    "profile_from_wire",
    "tensor_regions",
]
