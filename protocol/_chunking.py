"""Content-defined chunking with FastCDC: the one chunker of server ingest and client saves.

A namespace is bound to one `ChunkingProfile` for life: dedup only works when every producer
cuts the same bytes at the same places, so the server advertises the profile on every upload
(`ChunkingProfile.to_wire`) and clients cut with exactly it. FastCDC restarts its rolling hash
at every cut, which is what lets `StreamChunker` chunk an unbounded stream piece by piece: the
last chunk of a piece is carried into the next one, and the cuts come out exactly as if the
whole stream had been in memory. This is the only module of protocol that imports
outside the standard library (pyfastcdc, a client dependency).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyfastcdc import FastCDC

ALGORITHM = "fastcdc"
VARIANT = "fastcdc2020"


@dataclass(frozen=True)
class ChunkingProfile:
    """FastCDC parameters exactly as passed to pyfastcdc (normalized chunking 1, seed 0),
    and `tensor_pieces`: when not 0, tensors of that size or more in torch.save archives and
    safetensors files are cut at their first byte and in pieces of that size (_layout.py).

    Note pyfastcdc's mean chunk is about avg_size + min_size (cut-point skipping).
    """

    name: str
    min_size: int
    avg_size: int
    max_size: int
    tensor_pieces: int = 0

    def to_wire(self) -> dict[str, object]:
        wire: dict[str, object] = {
            "algorithm": ALGORITHM,
            "variant": VARIANT,
            "normalized_chunking": 1,
            "seed": 0,
            "profile": self.name,
            "min_size": self.min_size,
            "avg_size": self.avg_size,
            "max_size": self.max_size,
        }
        if self.tensor_pieces:
            wire["tensor_pieces"] = self.tensor_pieces
        return wire

    @classmethod
    def from_wire(cls, d: Mapping[str, object]) -> ChunkingProfile:
        """The profile an upload answer advertised; ValueError for one we cannot cut with."""
        if d.get("algorithm") != ALGORITHM or d.get("variant", VARIANT) != VARIANT:
            raise ValueError(f"unsupported chunking {dict(d)!r}")
        sizes = [d.get(k) for k in ("min_size", "avg_size", "max_size")]
        pieces = d.get("tensor_pieces", 0)
        if not all(isinstance(s, int) and not isinstance(s, bool) for s in [*sizes, pieces]):
            raise ValueError(f"chunking needs integer sizes, got {dict(d)!r}")
        lo, avg, hi, tp = (int(str(s)) for s in [*sizes, pieces])
        return cls(str(d.get("profile", "custom")), lo, avg, hi, tp)

    def chunker(self) -> FastCDC:
        from pyfastcdc import FastCDC  # only what cuts pays its import (~8 ms): not a pull

        return FastCDC(self.avg_size, min_size=self.min_size, max_size=self.max_size)


class StreamChunker:
    """Cuts a stream fed in arbitrary pieces into the same chunks as cutting it whole.

    `cuts`: offsets where a chunk must end. `regions`: [start, end) ranges (tensors, from
    `tensor_regions`) cut into fixed pieces of the profile's `tensor_pieces` bytes from their
    start; FastCDC cuts everything else, restarting at every forced boundary.
    """

    def __init__(
        self,
        profile: ChunkingProfile | Mapping[str, object],
        cuts: Sequence[int] = (),
        regions: Sequence[tuple[int, int]] = (),
    ) -> None:
        if not isinstance(profile, ChunkingProfile):
            profile = ChunkingProfile.from_wire(profile)
        self._cdc = profile.chunker()
        self._piece = profile.tensor_pieces
        self._regions = list(regions) if self._piece else []
        self._starts = [s for s, _ in self._regions]
        bounds = set(cuts) | {x for r in self._regions for x in r}
        self._bounds = sorted(b for b in bounds if b > 0)
        self._pos = 0  # offset of the next byte fed
        self._tail: list[bytes | memoryview] = []  # fed since the last cut, not yet a chunk

    def _region_at(self, pos: int) -> tuple[int, int] | None:
        i = bisect.bisect_right(self._starts, pos) - 1
        if i >= 0 and pos < self._regions[i][1]:
            return self._regions[i]
        return None

    def _next_bound(self, pos: int, region: tuple[int, int] | None) -> int | None:
        i = bisect.bisect_right(self._bounds, pos)
        forced = self._bounds[i] if i < len(self._bounds) else None
        if region is None:
            return forced
        piece_end = region[0] + ((pos - region[0]) // self._piece + 1) * self._piece
        return min(piece_end, region[1]) if forced is None else min(piece_end, region[1], forced)

    def feed(self, piece: bytes, final: bool) -> list[memoryview]:
        """Return the chunks completed by `piece`; with final=True, all remaining ones."""
        out: list[memoryview] = []
        view = memoryview(piece)
        at = 0
        while at < len(view):
            region = self._region_at(self._pos)
            bound = self._next_bound(self._pos, region)
            take = len(view) - at if bound is None else min(bound - self._pos, len(view) - at)
            self._tail.append(view[at : at + take])
            at += take
            self._pos += take
            reached = bound is not None and self._pos == bound
            if region is not None:
                if reached:
                    out.append(self._take_tail())
            else:
                out += self._cut(reached)
        if final and self._tail:
            out += self._cut(True)
        return out

    def _take_tail(self) -> memoryview:
        tail = self._tail
        self._tail = []
        return memoryview(tail[0]) if len(tail) == 1 else memoryview(b"".join(tail))

    def _cut(self, whole: bool) -> list[memoryview]:
        """FastCDC over the bytes since the last cut; the last chunk is carried unless
        `whole` (the segment ends here), since more bytes could move its end."""
        buf = self._take_tail()
        chunks = [c.data for c in self._cdc.cut_buf(buf)] if len(buf) else []
        if not whole and chunks:
            self._tail = [bytes(chunks.pop())]
        return chunks
