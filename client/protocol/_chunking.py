"""Content-defined chunking with FastCDC: the one chunker of server ingest and client saves.

A namespace is bound to one `ChunkingProfile` for life: dedup only works when every producer
cuts the same bytes at the same places, so the server advertises the profile on every upload
(`ChunkingProfile.to_wire`) and clients cut with exactly it. FastCDC restarts its rolling hash
at every cut, which is what lets `StreamChunker` chunk an unbounded stream piece by piece: the
last chunk of a piece is carried into the next one, and the cuts come out exactly as if the
whole stream had been in memory. This is the only module of client/protocol that imports
outside the standard library (pyfastcdc, a client dependency).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyfastcdc import FastCDC

ALGORITHM = "fastcdc"
VARIANT = "fastcdc2020"


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
            "algorithm": ALGORITHM,
            "variant": VARIANT,
            "normalized_chunking": 1,
            "seed": 0,
            "profile": self.name,
            "min_size": self.min_size,
            "avg_size": self.avg_size,
            "max_size": self.max_size,
        }

    @classmethod
    def from_wire(cls, d: Mapping[str, object]) -> ChunkingProfile:
        """The profile an upload answer advertised; ValueError for one we cannot cut with."""
        if d.get("algorithm") != ALGORITHM or d.get("variant", VARIANT) != VARIANT:
            raise ValueError(f"unsupported chunking {dict(d)!r}")
        sizes = [d.get(k) for k in ("min_size", "avg_size", "max_size")]
        if not all(isinstance(s, int) and not isinstance(s, bool) for s in sizes):
            raise ValueError(f"chunking needs integer sizes, got {dict(d)!r}")
        lo, avg, hi = (int(str(s)) for s in sizes)
        return cls(str(d.get("profile", "custom")), lo, avg, hi)

    def chunker(self) -> FastCDC:
        return FastCDC(self.avg_size, min_size=self.min_size, max_size=self.max_size)


class StreamChunker:
    """Cuts a stream fed in arbitrary pieces into the same chunks as cutting it whole."""

    def __init__(self, profile: ChunkingProfile | Mapping[str, object]) -> None:
        if not isinstance(profile, ChunkingProfile):
            profile = ChunkingProfile.from_wire(profile)
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
