"""Content-defined chunking with FastCDC, identical on server and client.

A namespace is bound to one `ChunkingProfile` for life: dedup only works when every producer
cuts the same bytes at the same places, so the server advertises the profile on every upload
and clients must use it. FastCDC restarts its rolling hash at every cut, which is what lets
`StreamChunker` chunk an unbounded stream piece by piece: the last chunk of a piece is carried
into the next one, and the cuts come out exactly as if the whole stream had been in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyfastcdc import FastCDC

from .errors import InvalidRequest

# pyfastcdc's accepted ranges (see its FastCDC docstring).
_MIN_RANGE = (64, 1 << 20)
_AVG_RANGE = (256, 4 << 20)
_MAX_RANGE = (1024, 16 << 20)


@dataclass(frozen=True)
class ChunkingProfile:
    """FastCDC parameters exactly as passed to pyfastcdc (normalized chunking 1, seed 0).

    Note pyfastcdc's mean chunk is about avg_size + min_size (cut-point skipping).
    """

    name: str
    min_size: int
    avg_size: int
    max_size: int

    def to_wire(self) -> dict[str, object]:
        return {
            "algorithm": "fastcdc",
            "variant": "fastcdc2020",
            "normalized_chunking": 1,
            "seed": 0,
            "profile": self.name,
            "min_size": self.min_size,
            "avg_size": self.avg_size,
            "max_size": self.max_size,
        }

    def chunker(self) -> FastCDC:
        return FastCDC(self.avg_size, min_size=self.min_size, max_size=self.max_size)


# Agent state is re-serialized whole at every step; only small chunks line up with the
# unchanged messages (docs/DESIGN.md "Chunking profiles" has the measurements).
SMALL = ChunkingProfile("small", min_size=512, avg_size=1536, max_size=8192)
# Tensors: large chunks keep per-chunk overhead (catalog entry, hash, LMDB page rounding) low.
LARGE = ChunkingProfile("large", min_size=16384, avg_size=49152, max_size=262144)
PROFILES = {p.name: p for p in (SMALL, LARGE)}
DEFAULT_PROFILE = LARGE


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
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidRequest("chunking needs integer min_size, avg_size and max_size") from e
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
    return ChunkingProfile("custom", lo, avg, hi)


class StreamChunker:
    """Cuts a stream fed in arbitrary pieces into the same chunks as cutting it whole."""

    def __init__(self, profile: ChunkingProfile) -> None:
        self._cdc = profile.chunker()
        self._tail = b""

    def feed(self, piece: bytes, final: bool) -> list[memoryview]:
        """Return the chunks completed by `piece`; with final=True, all remaining ones."""
        buf = self._tail + piece if self._tail else piece
        chunks = [c.data for c in self._cdc.cut_buf(buf)] if buf else []
        if final or not chunks:
            self._tail = b""
            return chunks
        self._tail = bytes(chunks.pop())
        return chunks
