"""The cluster's shared chunk index: which chunks are already in the shared tier, for every
node, so a chunk any node has shipped is neither sent again by a producer nor packed again.

Kept in the shared tier itself, beside the packs it names, as immutable *segments*: one per
pack, `index/<writer>-<random>.seg`, written with a conditional create (If-None-Match: *)
after the pack and its size check (`packs.upload`), before the shipping node switches its
own pointers. No object is ever rewritten, so writers need no lock and no compare-and-swap;
a reader lists `index/`, fetches the segments it has not seen, and merges them into a map
chunk id -> (pack, offset, length, plaintext size, flags). Segments are merged into
segments of many packs by compaction (sharedcompact.py), so a process that starts fetches
a few objects, not one per pack ever shipped.

Segment format (little-endian; sealed whole with the cluster's key ring when encryption is
on, bound to its key): magic `CVSI`, u16 version; version 1 (one pack): u32 entry count,
u16 pack-key length, the pack key, then per entry chunk id (32 bytes), u64 offset, u32
length, u64 plaintext size, u8 flags; version 2 (merged): u32 pack count, then per pack u16
pack-key length, u32 entry count, the pack key and its entries as in version 1.

Invariants:
1. A segment names only a pack that is whole in the tier (published after the upload's
   size check): an entry never points at bytes that are not there (Xet's upload order).
2. A pack a segment names is deleted only by the cross-node sweep (sharedgc.py), which
   proves no node's catalog names it; `Mover.delete_unreferenced_pack` (a node's own GC)
   asks `lists` and leaves it alone.
3. A node deletes, in the shared tier, only unlisted packs it wrote itself (pack ids start
   with its writer name): another node's unlisted pack may be between upload and publish.
4. Every listed copy of a chunk holds the same verified frame, so which copy a reader picks
   does not matter; the first merged wins. Reads verify every frame against its id anyway.
5. Delta frames (compaction's) are never listed: they need their base in the same catalog.
6. A chunk is taken from the index (adopted by `missing`, reused by demotion, a pack of
   one's own switched to) only while the `gate` allows its pack: not condemned by the
   sweep, and this process's view of the condemned packs fresh (sharedgc.py). Lookups
   answer nothing from a condemned pack; callers check `takeable` again inside the
   writer transaction that records the take.
"""

from __future__ import annotations

import secrets
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from ..errors import ObjectNotFound, TierError
from ..seal import Keyring, open_blob
from ..tier import Tier
from .location import Packed

INDEX_PREFIX = "index/"
REFRESH_EVERY = 1.0  # seconds: a lookup that misses lists the index at most this often
_HEAD = struct.Struct("<4sHIH")  # magic, version, entries, pack-key length
_MERGED = struct.Struct("<4sHI")  # magic, version, packs
_PACK = struct.Struct("<HI")  # pack-key length, entries
_ENTRY = struct.Struct("<32sQIQB")  # chunk, offset, length, plaintext size, flags
_MAGIC = b"CVSI"
_VERSION = 1
_VERSION_MERGED = 2


Row = tuple[bytes, int, int, int, int]  # chunk, offset, length, plaintext size, flags
Listing = list[tuple[str, list[Row]]]  # what a segment lists: each pack with its chunks


@dataclass(frozen=True, slots=True)
class SharedEntry:
    where: Packed
    size: int  # plaintext bytes
    flags: int  # the chunk's codec flags (vault/content/chunks.py), never damaged or delta


def encode_segment(pack_key: str, entries: Iterable[Row]) -> bytes:
    rows = list(entries)
    key = pack_key.encode()
    head = _HEAD.pack(_MAGIC, _VERSION, len(rows), len(key)) + key
    return head + b"".join(_ENTRY.pack(*r) for r in rows)


def decode_segment(raw: bytes) -> tuple[str, list[Row]]:
    magic, version, count, n = _HEAD.unpack_from(raw)
    start = _HEAD.size + n
    if magic != _MAGIC or version != _VERSION or len(raw) != start + count * _ENTRY.size:
        raise TierError("shared index segment is damaged")
    key = raw[_HEAD.size : start].decode()
    return key, list(_ENTRY.iter_unpack(raw[start:]))


def encode_merged(listing: Listing) -> bytes:
    out = [_MERGED.pack(_MAGIC, _VERSION_MERGED, len(listing))]
    for pack_key, rows in listing:
        key = pack_key.encode()
        out += [_PACK.pack(len(key), len(rows)), key, *(_ENTRY.pack(*r) for r in rows)]
    return b"".join(out)


def decode_listing(raw: bytes) -> Listing:
    """Either version: a one-pack segment is a listing of one."""
    if len(raw) < _MERGED.size:
        raise TierError("shared index segment is damaged")
    magic, version, packs = _MERGED.unpack_from(raw)
    if magic != _MAGIC or version != _VERSION_MERGED:
        return [decode_segment(raw)]
    out: Listing = []
    at = _MERGED.size
    try:
        for _ in range(packs):
            n, count = _PACK.unpack_from(raw, at)
            at += _PACK.size
            key = raw[at : at + n].decode()
            at += n
            end = at + count * _ENTRY.size
            if end > len(raw):
                raise TierError("shared index segment is damaged")
            out.append((key, list(_ENTRY.iter_unpack(raw[at:end]))))
            at = end
    except (struct.error, UnicodeDecodeError):
        raise TierError("shared index segment is damaged") from None
    if at != len(raw):
        raise TierError("shared index segment is damaged")
    return out


class Gate(Protocol):
    """What the cross-node GC (sharedgc.py) lets this process take from the index."""

    def ready(self) -> bool:
        """Whether takes may happen now (the condemned view fresh; refreshed if due)."""
        ...

    def allows(self, pack_key: str) -> bool:
        """Whether a chunk of this pack may be taken now: no I/O (called in the writer)."""
        ...


class SharedIndex:
    """One process's view of the shared index, merged from the segments it has listed.
    Thread-safe: lookups come from request threads, publishes from the mover."""

    def __init__(
        self,
        tier: Tier,
        tier_name: str,
        writer: str,
        keyring: Keyring | None = None,
        refresh_every: float = REFRESH_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tier = tier
        self.tier_name = tier_name
        self.writer = writer  # this process's name in segment and pack ids
        self._keyring = keyring
        self._refresh_every = refresh_every
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[bytes, SharedEntry] = {}
        self._segments: dict[str, frozenset[str]] = {}  # segment -> the packs it lists
        self._rows: dict[str, int] = {}  # segment -> how many chunks it lists
        self._packs: set[str] = set()
        self._excluded: frozenset[str] = frozenset()  # condemned packs: never looked up
        self.gate: Gate | None = None  # the cross-node GC's (sharedgc.py); None: take all
        self._refreshed = float("-inf")
        self.segments_read = 0  # segments fetched since start (for the measurement)
        self._vanished = False  # the last refresh found a listed segment gone

    def new_pack_id(self) -> str:
        """Pack ids in the shared tier name their writer (invariant 3)."""
        return f"{self.writer}-{secrets.token_hex(16)}"

    def owns(self, pack_key: str) -> bool:
        return pack_key.rsplit("/", 1)[-1].startswith(self.writer + "-")

    def publish(self, pack_key: str, entries: Iterable[Row]) -> str:
        """List a whole pack's chunks for every node: (chunk, offset, length, size, flags)."""
        rows = list(entries)
        return self._put([(pack_key, rows)], encode_segment(pack_key, rows))

    def publish_merged(self, listing: Listing) -> str:
        """One segment listing several packs (compaction, a sweep's rewrite); the caller
        deletes the segments it replaces only after this returns."""
        return self._put(listing, encode_merged(listing))

    def _put(self, listing: Listing, blob: bytes) -> str:
        key = f"{INDEX_PREFIX}{self.writer}-{secrets.token_hex(8)}.seg"
        if self._keyring is not None:
            blob = self._keyring.seal_blob(blob, key.encode())
        self.tier.put(key, blob, if_absent=True)
        with self._lock:
            self._merge(key, listing)
        return key

    def fetch(self, seg: str) -> Listing:
        """A segment as the store holds it now (`ObjectNotFound` once deleted)."""
        return decode_listing(open_blob(self._keyring, self.tier.get(seg), seg.encode()))

    def _merge(self, seg: str, listing: Listing) -> None:
        self._segments[seg] = frozenset(pack for pack, _ in listing)
        self._rows[seg] = sum(len(rows) for _, rows in listing)
        for pack_key, rows in listing:
            self._packs.add(pack_key)
            if pack_key in self._excluded:
                continue
            for cid, offset, length, size, flags in rows:
                if cid not in self._entries:
                    where = Packed(self.tier_name, pack_key, offset, length)
                    self._entries[cid] = SharedEntry(where, size, flags)

    def _drop(self, packs: set[str]) -> None:
        """Forget the chunks these packs hold (under the lock): one pass over the map. A
        chunk also in another pack is found again once that pack's segment is fetched
        anew; until then it is simply not found (sent again, never wrong)."""
        if packs:
            self._entries = {c: e for c, e in self._entries.items() if e.where.key not in packs}

    def exclude(self, packs: frozenset[str]) -> None:
        """Condemned packs (sharedgc.py): their chunks are no longer found; packs no
        longer condemned are fetched again."""
        with self._lock:
            if packs == self._excluded:
                return
            released = self._excluded - packs
            self._drop(set(packs - self._excluded))
            self._excluded = packs
            again = [seg for seg, packs in self._segments.items() if packs & released]
            for seg in again:
                del self._segments[seg]  # fetched by the refresh below
                self._rows.pop(seg, None)
        if again:
            self.refresh()

    def segments(self) -> dict[str, frozenset[str]]:
        """Every segment held, with the packs it lists."""
        with self._lock:
            return dict(self._segments)

    def sizes(self) -> dict[str, tuple[int, int]]:
        """Every segment held: (packs, chunks) it lists."""
        with self._lock:
            return {seg: (len(p), self._rows.get(seg, 0)) for seg, p in self._segments.items()}

    def takeable(self, pack_key: str) -> bool:
        """Whether a chunk of this pack may be taken now (invariant 6; no I/O)."""
        gate = self.gate
        return gate is None or gate.allows(pack_key)

    def refresh(self) -> int:
        """Fetch the segments not seen yet, then forget those no longer listed (a sweep or
        a compaction deleted them: a compaction's merged segment, written before its
        sources go, is merged first, so its packs are never missing in between); returns
        how many were new. A segment listed but gone by the time it is fetched is skipped
        (`_vanished`: a merge of it may have been written after the listing)."""
        with self._lock:
            held = set(self._segments)  # one published during the list is not "gone"
        keys = {k for k in self.tier.list(INDEX_PREFIX) if k.endswith(".seg")}
        with self._lock:
            new = [k for k in keys if k not in self._segments]
        vanished = False
        for seg in new:
            try:
                listing = self.fetch(seg)
            except ObjectNotFound:
                vanished = True
                continue
            with self._lock:
                self._merge(seg, listing)
                self.segments_read += 1
        with self._lock:
            gone = [k for k in held if k not in keys and k in self._segments]
            if gone:
                for seg in gone:
                    del self._segments[seg]
                    self._rows.pop(seg, None)
                listed = set().union(*self._segments.values())
                self._drop(self._packs - listed)
                self._packs = listed
            self._vanished = vanished
            self._refreshed = self._clock()
        return len(new)

    def lookup(self, cids: Iterable[bytes]) -> dict[bytes, SharedEntry]:
        """Where the shared tier holds these chunks; the index is listed again first when
        one is unknown and the last listing is older than `refresh_every`."""
        wanted = list(cids)
        gate = self.gate
        if gate is not None and not gate.ready():
            return {}  # the condemned view is stale: take nothing rather than a doomed copy
        with self._lock:
            found = {c: self._entries[c] for c in wanted if c in self._entries}
            due = self._clock() - self._refreshed >= self._refresh_every
        if len(found) == len(wanted) or not due:
            return found
        self.refresh()
        with self._lock:
            return {c: self._entries[c] for c in wanted if c in self._entries}

    def lists(self, pack_key: str) -> bool:
        """Does any segment name this pack? Listed afresh: a delete must not trust a cache.
        A segment that vanished between the listing and its fetch may have been merged
        into one the listing missed: listed again, and if segments keep vanishing, the
        answer is yes (the pack stays)."""
        for _ in range(3):
            self.refresh()
            with self._lock:
                if pack_key in self._packs:
                    return True
                if not self._vanished:
                    return False
        return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
