"""The cluster's shared chunk index: which chunks are already in the shared tier, for every
node, so a chunk any node has shipped is neither sent again by a producer nor packed again.

Kept in the shared tier itself, beside the packs it names, as immutable *segments*: one per
pack, `index/<writer>-<random>.seg`, written with a conditional create (If-None-Match: *)
after the pack and its size check (`packs.upload`), before the shipping node switches its
own pointers. No object is ever rewritten, so writers need no lock and no compare-and-swap;
a reader lists `index/`, fetches the segments it has not seen, and merges them into a map
chunk id -> (pack, offset, length, plaintext size, flags).

Segment format (little-endian; sealed whole with the cluster's key ring when encryption is
on, bound to its key): magic `CVSI`, u16 version, u32 entry count, u16 pack-key length, the
pack key, then per entry chunk id (32 bytes), u64 offset, u32 length, u64 plaintext size,
u8 flags.

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
_ENTRY = struct.Struct("<32sQIQB")  # chunk, offset, length, plaintext size, flags
_MAGIC = b"CVSI"
_VERSION = 1


Row = tuple[bytes, int, int, int, int]  # chunk, offset, length, plaintext size, flags


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
        self._segments: dict[str, str] = {}  # segment -> the pack it lists
        self._packs: set[str] = set()
        self._excluded: frozenset[str] = frozenset()  # condemned packs: never looked up
        self.gate: Gate | None = None  # the cross-node GC's (sharedgc.py); None: take all
        self._refreshed = float("-inf")
        self.segments_read = 0  # segments fetched since start (for the measurement)

    def new_pack_id(self) -> str:
        """Pack ids in the shared tier name their writer (invariant 3)."""
        return f"{self.writer}-{secrets.token_hex(16)}"

    def owns(self, pack_key: str) -> bool:
        return pack_key.rsplit("/", 1)[-1].startswith(self.writer + "-")

    def publish(self, pack_key: str, entries: Iterable[Row]) -> str:
        """List a whole pack's chunks for every node: (chunk, offset, length, size, flags)."""
        rows = list(entries)
        key = f"{INDEX_PREFIX}{self.writer}-{secrets.token_hex(8)}.seg"
        blob = encode_segment(pack_key, rows)
        if self._keyring is not None:
            blob = self._keyring.seal_blob(blob, key.encode())
        self.tier.put(key, blob, if_absent=True)
        with self._lock:
            self._merge(key, pack_key, rows)
        return key

    def _merge(self, seg: str, pack_key: str, rows: list[Row]) -> None:
        self._segments[seg] = pack_key
        self._packs.add(pack_key)
        if pack_key in self._excluded:
            return
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
            again = [seg for seg, pack in self._segments.items() if pack in released]
            for seg in again:
                del self._segments[seg]  # fetched by the refresh below
        if again:
            self.refresh()

    def segments(self) -> dict[str, str]:
        """Every segment held, with the pack it lists."""
        with self._lock:
            return dict(self._segments)

    def takeable(self, pack_key: str) -> bool:
        """Whether a chunk of this pack may be taken now (invariant 6; no I/O)."""
        gate = self.gate
        return gate is None or gate.allows(pack_key)

    def refresh(self) -> int:
        """Fetch the segments not seen yet, and forget those no longer listed (the sweep
        deleted them); returns how many were new. A segment listed but gone by the time it
        is fetched is skipped."""
        with self._lock:
            held = set(self._segments)  # one published during the list is not "gone"
        keys = {k for k in self.tier.list(INDEX_PREFIX) if k.endswith(".seg")}
        with self._lock:
            new = [k for k in keys if k not in self._segments]
            gone = [k for k in held if k not in keys and k in self._segments]
            packs = {self._segments.pop(seg) for seg in gone}
            self._drop(packs - set(self._segments.values()))
            self._packs -= packs - set(self._segments.values())
        for seg in new:
            try:
                raw = open_blob(self._keyring, self.tier.get(seg), seg.encode())
            except ObjectNotFound:
                continue
            pack_key, rows = decode_segment(raw)
            with self._lock:
                self._merge(seg, pack_key, rows)
                self.segments_read += 1
        with self._lock:
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
        """Does any segment name this pack? Listed afresh: a delete must not trust a cache."""
        self.refresh()
        with self._lock:
            return pack_key in self._packs

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
