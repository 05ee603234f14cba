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

import os
from collections.abc import Callable, Iterator, Sequence

import blake3
import lmdb

from ..env import Pin
from ..errors import ChunkCorrupt, SealBroken, TierError, Unavailable
from ..frame import Decoder, delta_base, open_frame, raw_payload
from ..manifest import FileEntry
from ..writer import WriteTxn
from .chunks import ChunkMeta
from .location import HotFrame, Inline, Packed
from .packs import read_frames
from .parts import ContentParts


def _base(frame: bytes | None) -> bytes | None:
    return delta_base(frame) if frame is not None else None


READ_BATCH_BYTES = 4 << 20  # per worker-thread call: amortizes the hop, bounds memory
MAX_CHAIN = 8  # deltas one read may decode; compaction never builds longer chains
DECODE_SLICES = 2  # a read batch is decoded in this many parts at once
# Below this much plaintext a read batch is decoded on the calling thread: handing it to
# the decoder threads and back costs more than decoding it (an agent's 40 kB state, 17
# chunks: 0.58 ms read back and hashed through the threads).
PARALLEL_DECODE_BYTES = 256 << 10

Plain = bytes | memoryview


class Reader:
    def __init__(self, store: ContentParts) -> None:
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
                    raw = chunks.inline_frame(txn, cid, where)
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
        known = dict(zip(cids, zip(metas, frames, strict=True), strict=True))
        self._fetch_bases(known)
        quick = self._quick(cids, known, verify)
        damaged: set[bytes] = set()
        memo: dict[bytes, Plain | None] = {}
        out: list[Plain | None] = []
        for cid, plain in zip(cids, quick, strict=True):
            meta, frame = known[cid]
            if meta is None or plain is not None:
                out.append(plain)
            elif frame is not None and delta_base(frame) is not None:
                out.append(self._slow(cid, known, damaged, memo))  # find the damaged frame
            else:
                damaged.add(cid)
                out.append(None)
        return out, damaged

    def _quick(
        self,
        cids: Sequence[bytes],
        known: dict[bytes, tuple[ChunkMeta | None, bytes | None]],
        verify: bool,
    ) -> list[Plain | None]:
        """Decode and verify every chunk, side by side on the store's decoder threads (zstd,
        numpy and BLAKE3 release the GIL: hashing alone caps one core at ~1.5 GB/s); a delta
        chain in one pass (`Decoder.chain`). None where that fails."""

        def some(part: Sequence[bytes]) -> list[Plain | None]:
            decoder = Decoder()  # one per call: making one costs more than a 2 kB chunk
            return [one(cid, decoder) for cid in part]

        def one(cid: bytes, decoder: Decoder) -> Plain | None:
            meta, frame = known[cid]
            if meta is None or frame is None:
                return None
            if delta_base(frame) is not None:
                chain = self._chain_frames(cid, known)
                return decoder.chain(chain, cid) if chain else None
            try:
                return decoder.plaintext(frame, cid, verify)
            except ChunkCorrupt:
                return None

        size = sum(m.size for m, _ in map(known.__getitem__, cids) if m is not None)
        if len(cids) < 8 or size < PARALLEL_DECODE_BYTES:
            return some(cids)
        # A few slices, not a task per chunk: submitting costs about what hashing 64 KiB does.
        step = -(-len(cids) // DECODE_SLICES)
        slices = [cids[i : i + step] for i in range(0, len(cids), step)]
        return [plain for part in self._s.runtime.decode.map(some, slices) for plain in part]

    def _fetch_bases(self, known: dict[bytes, tuple[ChunkMeta | None, bytes | None]]) -> None:
        """Add the frames every delta in `known` needs, level by level (one batched lookup
        per level, at most MAX_CHAIN levels)."""
        level = list(known)
        for _ in range(MAX_CHAIN):
            wanted = sorted(
                {b for c in level if (b := _base(known[c][1])) is not None and b not in known}
            )
            if not wanted:
                return
            metas, frames = self.frames(wanted)
            known.update(zip(wanted, zip(metas, frames, strict=True), strict=True))
            level = wanted

    @staticmethod
    def _chain_frames(
        cid: bytes, known: dict[bytes, tuple[ChunkMeta | None, bytes | None]]
    ) -> list[bytes] | None:
        """The frames a read of `cid` needs, nearest first; None if one is missing."""
        out: list[bytes] = []
        cur: bytes | None = cid
        while cur is not None and len(out) <= MAX_CHAIN:
            meta, frame = known.get(cur, (None, None))
            if meta is None or frame is None:
                return None
            out.append(frame)
            cur = delta_base(frame)
        return out if cur is None else None

    def _slow(
        self,
        cid: bytes,
        known: dict[bytes, tuple[ChunkMeta | None, bytes | None]],
        damaged: set[bytes],
        memo: dict[bytes, Plain | None],
        depth: int = 0,
    ) -> Plain | None:
        """Decode level by level, verifying every base: finds which frame is damaged."""
        if cid in memo:
            return memo[cid]
        meta, frame = known.get(cid, (None, None))
        plain: Plain | None = None
        base = _base(frame)
        try:
            if meta is None:
                plain = None  # collected: nothing to flag
            elif frame is None:
                raise ChunkCorrupt(cid.hex())
            elif base is None:
                plain = Decoder().plaintext(frame, cid)
            elif depth >= MAX_CHAIN:
                raise ChunkCorrupt(cid.hex())
            else:
                base_plain = self._slow(base, known, damaged, memo, depth + 1)
                if base_plain is not None:
                    plain = Decoder().plaintext(frame, cid, True, base_plain)
                elif base not in damaged:  # gone, or a chain past MAX_CHAIN
                    raise ChunkCorrupt(cid.hex())
                # else: a damaged base is flagged, and flagging it flags this one
        except ChunkCorrupt:
            damaged.add(cid)
        memo[cid] = plain
        return plain

    def _plaintexts(self, cids: Sequence[bytes], verify: bool = True) -> Iterator[Plain]:
        """Verified plaintext of each chunk, in order."""
        metas, frames = self.frames(cids)
        plain, damaged = self.decoded(cids, metas, frames, verify)
        read_only = self._s.writer.refusal() is not None
        if damaged and not read_only:
            self.flag_damaged(damaged)
        for cid, data, frame in zip(cids, plain, frames, strict=True):
            if data is None and read_only and frame is None:
                # A standby that has not yet applied the change that moved it (the primary
                # deletes a pack only once the replica has passed that change): not ours
                # to flag; the next read after the next poll finds it.
                raise Unavailable(f"chunk {cid.hex()} has moved; retry (this is a standby)")
            if data is None:
                raise ChunkCorrupt(cid.hex())
            yield data

    def chunks(self, cids: Sequence[bytes]) -> list[Plain]:
        """Verified plaintext of each chunk, in order (views where decoding made no copy:
        a download writes them to the socket as they are)."""
        return list(self._plaintexts(cids))

    def copied(self, cids: Sequence[bytes], room: Callable[[int], bytearray]) -> list[Plain] | None:
        """The chunks in order as verified plaintexts, the raw hot frames among them copied
        out of the frame environment's data file into a buffer `room(n)` gives (n: the
        bytes they take), with one `preadv` each inside one read transaction; chunks that
        are not sound raw hot frames (zstd, deltas, packed, damaged) are read the usual
        way, which raises on and flags what is damaged. None (nothing copied) if no chunk
        is a raw hot frame: the caller reads the batch the usual way.

        Why a copy (issue 41): pages of the data file are reused in place by LMDB once no
        reader holds them, and bytes handed to a socket by reference (sendfile) are read
        from those pages when they leave, which may be long after. What this returns
        lives in the caller's memory, hashed after the copy: the bytes verified are the
        bytes the caller sends, whatever happens to the file later. The buffer must stay
        untouched until the caller is done with the views into it."""
        _, wheres = self._sound_hot(cids)
        if not any(isinstance(w, HotFrame) for w in wheres):
            return None
        parts: list[Plain | None] = [None] * len(cids)
        pin = self._s.frames_env.pin()
        try:
            spots = self._spots(pin, wheres)
            buf = memoryview(room(sum(n for _, _, n in spots)) if spots else bytearray())
            pos = 0
            for i, offset, n in spots:
                copy = buf[pos : pos + n]
                pos += n
                if _pread_into(pin, copy, offset):
                    parts[i] = copy
        finally:
            pin.release()  # the copies are ours: no page of the file is read after this
        for i, part in enumerate(parts):
            if part is not None and blake3.blake3(part).digest() != cids[i]:
                parts[i] = None  # read the usual way below, which flags it
        rest = [i for i, part in enumerate(parts) if part is None]
        if len(rest) == len(cids):
            return None
        self._s.frames_env.note_io(sum(len(part) for part in parts if part is not None))
        for i, data in zip(rest, self.chunks([cids[i] for i in rest]), strict=True):
            parts[i] = data
        return [part for part in parts if part is not None]  # every one, by now

    def copy_into(self, cids: Sequence[bytes], sizes: Sequence[int], into: memoryview) -> None:
        """Each chunk's verified plaintext, in order, laid end to end in `into` (exactly
        `sizes` long, the chunks' plaintext lengths as the manifest has them). Raw hot
        frames are copied from the data file with one `preadv` each under one pin, as
        `copied` does, then hashed; every other chunk, and a copy that fails its hash, is
        read the usual way (which raises on and flags what is damaged) and copied in. A
        chunk of another length than the manifest says is a bug (RuntimeError): no byte of
        `into` may be left as it was."""
        at = [0]
        for n in sizes:
            at.append(at[-1] + n)
        if at[-1] != len(into):
            raise ValueError(f"{len(into)} bytes of room for {at[-1]} bytes of chunks")
        done = [False] * len(cids)
        _, wheres = self._sound_hot(cids)
        if any(isinstance(w, HotFrame) for w in wheres):
            pin = self._s.frames_env.pin()
            try:
                for i, offset, n in self._spots(pin, wheres):
                    if n == sizes[i]:
                        done[i] = _pread_into(pin, into[at[i] : at[i + 1]], offset)
            finally:
                pin.release()  # the copies are ours: no page of the file is read after this
            for i, cid in enumerate(cids):
                if done[i] and blake3.blake3(into[at[i] : at[i + 1]]).digest() != cid:
                    done[i] = False  # read the usual way below, which flags it
            self._s.frames_env.note_io(sum(n for n, ok in zip(sizes, done, strict=True) if ok))
        rest = [i for i, ok in enumerate(done) if not ok]
        if not rest:
            return
        for i, data in zip(rest, self.chunks([cids[i] for i in rest]), strict=True):
            if len(data) != sizes[i]:
                raise RuntimeError(f"chunk {cids[i].hex()}: {len(data)} bytes, not {sizes[i]}")
            into[at[i] : at[i + 1]] = data

    def _spots(self, pin: Pin, wheres: Sequence[HotFrame | None]) -> list[tuple[int, int, int]]:
        """(index, offset in the data file, length) of each raw hot frame's plaintext, as
        `pin` sees it; only headers are read through the map."""
        spots = []
        for i, where in enumerate(wheres):
            view = self._raw_view(pin.txn, where)
            if view is not None:
                spots.append((i, pin.offset(view), len(view)))
        return spots

    def flag_damaged(self, cids: set[bytes]) -> None:
        """Flag chunks damaged (and what depends on them) without waiting for the write."""

        def op(w: WriteTxn) -> None:
            for cid in cids:
                self._s.chunks.mark_damaged(w.catalog, cid)

        self._s.writer.submit(op)

    def file_hash(self, entry: FileEntry) -> bytes:
        """BLAKE3 of the file as stored.

        Chunks are not re-hashed one by one here: each was verified when it was stored, and
        a damaged one makes the file hash differ anyway, which refuses the commit. A batch
        of raw frames in the frame environment (what an upload just wrote) is hashed in
        place in the memory map, inside one short read transaction: copying a 1 GB file
        out of the map first cost more than hashing it. One thread: the map hands out a
        chunk (~256 KiB) at a time, and blake3's threads split each such update at a cost
        above what they save (1 GB: 0.41-0.44 s on one core against 0.46-0.57 s and
        twice the CPU with every core, copying into 8 MiB updates no better)."""
        h = blake3.blake3()
        self.hash_into(entry.chunks, h)
        return h.digest()

    def hash_into(self, chunks: Sequence[tuple[bytes, int]], h: blake3.blake3) -> None:
        """Feed `h` the stored plaintexts of `chunks` ((id, size), in order), as
        `file_hash` does."""
        for batch in batches(chunks):
            if not self._hash_in_place(batch, h):
                for data in self._plaintexts(batch, verify=False):
                    h.update(data)

    def _hash_in_place(self, cids: Sequence[bytes], h: blake3.blake3) -> bool:
        """Feed `h` the batch straight from the map if every chunk is a raw hot frame;
        False (and `h` untouched) otherwise."""
        metas, wheres = self._sound_hot(cids)
        if not all(wheres):
            return False
        with self._s.frames_env.read() as txn:
            views = [self._raw_view(txn, where) for where in wheres]
            if any(view is None for view in views):
                return False
            for view in views:
                assert view is not None
                h.update(view)
            del views
        self._s.frames_env.note_io(sum(m.stored for m in metas if m is not None))
        return True

    def _sound_hot(
        self, cids: Sequence[bytes]
    ) -> tuple[list[ChunkMeta | None], list[HotFrame | None]]:
        """Each chunk's metadata, and its hot frame's place if it has one and is sound."""
        chunks = self._s.chunks
        with self._s.catalog_env.read() as txn:
            metas = [chunks.meta(txn, cid) for cid in cids]
        wheres = [
            m.where if m is not None and not m.damaged and isinstance(m.where, HotFrame) else None
            for m in metas
        ]
        return metas, wheres

    def _raw_view(self, txn: lmdb.Transaction, where: HotFrame | None) -> memoryview | None:
        """The plaintext of a raw hot frame as a view into the map (valid while `txn` is
        open); None for any other chunk."""
        frame = self._s.chunks.hot_frame(txn, where) if where is not None else None
        return raw_payload(frame) if frame is not None else None


class CopyBuffers:
    """Where a reader's raw hot frames are copied to, batch by batch (`Reader.copied`'s
    `room`): two buffers in turn, for a reader that copies one batch while the one before
    is sent or written, and never more, so a copy never lands in a buffer still being read.
    `reuse=False` gives a fresh buffer each time, for a consumer that may keep views after
    it is done (asyncio's TLS transport keeps what it has not encrypted yet). Reused
    buffers spare zero-filling multi-MiB buffers for every batch."""

    def __init__(self, reuse: bool = True) -> None:
        self._reuse = reuse
        self._buffers = [bytearray(), bytearray()]
        self._turn = 0

    def __call__(self, size: int) -> bytearray:
        if not self._reuse:
            return bytearray(size)
        i, self._turn = self._turn, 1 - self._turn
        if len(self._buffers[i]) < size:
            self._buffers[i] = bytearray(size)
        return self._buffers[i]


def _pread_into(pin: Pin, into: memoryview, offset: int) -> bool:
    """Fill `into` from the data file at `offset` (the GIL released meanwhile); False if
    the file ends first."""
    fd = pin.file.fileno()
    while into:
        n = os.preadv(fd, [into], offset)
        if n == 0:
            return False
        into, offset = into[n:], offset + n
    return True


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
