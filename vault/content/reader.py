"""Reading chunks back: every byte is verified against its id before it leaves the engine.

Metadata comes from the catalog, frames from the frame environment. A chunk that fails
verification (or whose frame is gone while the catalog still lists it) is flagged damaged on
the spot, so the missing query starts reporting it and the next upload of the same bytes
heals it.

A delta frame is decoded against its base's plaintext, fetched and verified the same way
(recursively: a base may be a delta itself, up to MAX_CHAIN deep); a damaged base flags
every chunk that needs it.

A chunk can move while it is being read (demotion drops its hot frame, promotion or a repack
retires a pack): a frame missing on the first look is looked up once more before it counts
as damaged.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import blake3

from ..errors import ChunkCorrupt, SealBroken, TierError
from ..frame import Decoder, delta_base, open_frame
from ..manifest import FileEntry
from ..writer import WriteTxn
from .chunks import ChunkMeta
from .location import HotFrame, Inline, Packed
from .packs import read_frames

if TYPE_CHECKING:  # the store holds the chunk table this package defines
    from ..store import Store

READ_BATCH_BYTES = 4 << 20  # per worker-thread call: amortizes the hop, bounds memory
MAX_CHAIN = 8  # deltas one read may decode; compaction never builds longer chains

Plain = bytes | memoryview


class Reader:
    def __init__(self, store: Store) -> None:
        self._s = store

    def frames(self, cids: Sequence[bytes]) -> tuple[list[ChunkMeta | None], list[bytes | None]]:
        """Metadata and (plain) frame of each chunk, wherever it lives: the catalog
        (inline), the frame environment, or a pack in another tier. A frame that cannot be
        found, or fails to unseal, is None; a tier that does not answer raises
        TierUnavailable."""
        metas, frames = self._lookup(cids)
        misses = [i for i, (m, f) in enumerate(zip(metas, frames, strict=True)) if m and not f]
        if misses:  # moved under us? look again, once
            again_metas, again_frames = self._lookup([cids[i] for i in misses])
            for i, meta, frame in zip(misses, again_metas, again_frames, strict=True):
                metas[i], frames[i] = meta, frame
        return metas, frames

    def _lookup(self, cids: Sequence[bytes]) -> tuple[list[ChunkMeta | None], list[bytes | None]]:
        chunks = self._s.chunks
        metas: list[ChunkMeta | None] = []
        frames: list[bytes | None] = []
        packed: dict[str, dict[int, Packed]] = {}
        with self._s.catalog_env.read() as txn:
            for i, cid in enumerate(cids):
                meta = chunks.meta(txn, cid)
                metas.append(meta)
                frame = None
                where = meta.where if meta is not None else None
                if isinstance(where, Inline):
                    raw = chunks.inline_frame(txn, cid)
                    frame = bytes(raw) if raw is not None else None
                elif isinstance(where, Packed):
                    packed.setdefault(where.tier, {})[i] = where
                frames.append(frame)
        with self._s.frames_env.read() as txn:
            for i, meta in enumerate(metas):
                if meta is not None and isinstance(meta.where, HotFrame):
                    raw = chunks.hot_frame(txn, meta.where)
                    frames[i] = bytes(raw) if raw is not None else None
        for tier_name, wanted in packed.items():
            tier = self._s.tiers.get(tier_name)
            if tier is None:
                raise TierError(f"chunk is in tier {tier_name!r}, which is not configured")
            for i, frame in read_frames(tier, wanted).items():
                frames[i] = self._unseal(frame, cids[i])
        self._s.frames_env.note_io(sum(m.stored for m in metas if m is not None))
        return metas, frames

    def _unseal(self, frame: bytes | None, cid: bytes) -> bytes | None:
        if frame is None:
            return None
        try:
            return open_frame(self._s.keyring, frame, cid)
        except SealBroken:
            return None  # tampered with, truncated or misplaced: damaged

    def decoded(
        self,
        cids: Sequence[bytes],
        metas: Sequence[ChunkMeta | None],
        frames: Sequence[bytes | None],
        verify: bool = True,
    ) -> tuple[list[Plain | None], set[bytes]]:
        """The plaintext of each of `frames` (None where it cannot be read), delta bases
        fetched and decoded as needed; and every chunk found damaged on the way (bases
        included). Chunks without metadata (collected since) are None but not damaged."""
        return self._decode(cids, metas, frames, verify, 0)

    def _decode(
        self,
        cids: Sequence[bytes],
        metas: Sequence[ChunkMeta | None],
        frames: Sequence[bytes | None],
        verify: bool,
        depth: int,
    ) -> tuple[list[Plain | None], set[bytes]]:
        decoder = Decoder()
        out: list[Plain | None] = [None] * len(cids)
        damaged: set[bytes] = set()
        wanted: dict[int, bytes] = {}
        for i, (cid, meta, frame) in enumerate(zip(cids, metas, frames, strict=True)):
            if meta is None:
                continue
            base = delta_base(frame) if frame is not None else None
            if base is not None:
                wanted[i] = base
                continue
            try:
                if frame is None:
                    raise ChunkCorrupt(cid.hex())
                out[i] = decoder.plaintext(frame, cid, verify)
            except ChunkCorrupt:
                damaged.add(cid)
        if not wanted:
            return out, damaged
        bases = sorted(set(wanted.values()))
        plain: dict[bytes, Plain] = {}
        if depth < MAX_CHAIN:
            base_metas, base_frames = self.frames(bases)
            decoded, bad = self._decode(bases, base_metas, base_frames, True, depth + 1)
            damaged |= bad
            plain = {b: p for b, p in zip(bases, decoded, strict=True) if p is not None}
        for i, base in wanted.items():
            if base not in plain:
                if base not in damaged:  # gone, or a chain past MAX_CHAIN: this one is lost
                    damaged.add(cids[i])
                continue  # a damaged base is flagged, and flagging it flags this one
            try:
                out[i] = decoder.plaintext(frames[i] or b"", cids[i], True, plain[base])
            except ChunkCorrupt:
                damaged.add(cids[i])
        return out, damaged

    def _plaintexts(self, cids: Sequence[bytes], verify: bool = True) -> Iterator[Plain]:
        """Verified plaintext of each chunk, in order."""
        metas, frames = self.frames(cids)
        plain, damaged = self.decoded(cids, metas, frames, verify)
        if damaged:
            self.flag_damaged(damaged)
        for cid, data in zip(cids, plain, strict=True):
            if data is None:
                raise ChunkCorrupt(cid.hex())
            yield data

    def chunks(self, cids: Sequence[bytes]) -> list[bytes]:
        """Verified plaintext of each chunk, in order."""
        return [d if isinstance(d, bytes) else bytes(d) for d in self._plaintexts(cids)]

    def flag_damaged(self, cids: set[bytes]) -> None:
        """Flag chunks damaged (and what depends on them) without waiting for the write."""

        def op(w: WriteTxn) -> None:
            for cid in cids:
                self._s.chunks.mark_damaged(w.catalog, cid)

        self._s.writer.submit(op)

    def file_hash(self, entry: FileEntry) -> bytes:
        """BLAKE3 of the file as stored, read straight from the memory map.

        Chunks are not re-hashed one by one here: each was verified when it was stored, and
        a damaged one makes the file hash differ anyway, which refuses the commit."""
        h = blake3.blake3()
        for batch in batches(entry.chunks):
            for data in self._plaintexts(batch, verify=False):
                h.update(data)
        return h.digest()


def batches(
    chunks: Sequence[tuple[bytes, int]], limit: int = READ_BATCH_BYTES
) -> Iterator[list[bytes]]:
    """Group chunk ids into runs of about `limit` plaintext bytes."""
    batch: list[bytes] = []
    size = 0
    for cid, n in chunks:
        batch.append(cid)
        size += n
        if size >= limit:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch
