"""Manifests: for each file of a checkpoint, its size, whole-file hash and chunk list.

Every committed checkpoint has a complete manifest, so restoring any checkpoint reads only
its own manifest whatever its chain length. The binary form is compact (36 bytes per chunk)
because a 10 GiB file at 64 KiB chunks lists ~160,000 of them. Two stored forms: the
original one holds every entry whole; the current one names each file's entry, stored once
by content in `entries` (vault/entries.py), so a file inherited unchanged by a thousand
checkpoints costs 32 bytes in each, not its chunk list. Both are read; new commits write
the second.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from itertools import starmap

from checkpoint_vault.protocol import ChunkSpan, ManifestFile

_FILE_HEAD = struct.Struct("<Q32sI")
_CHUNK = struct.Struct("<32sI")
_NAME_LEN = struct.Struct("<H")
_COUNT = struct.Struct("<I")
# A manifest that names stored file entries (vault/entries.py) instead of holding them. A
# whole-entry manifest starts with its file count (u32); no checkpoint has 2**32 - 1 files.
_REFS_MAGIC = b"\xff\xff\xff\xff\x02"
_DIGEST_LEN = 32


@dataclass(frozen=True)
class FileEntry:
    size: int
    hash: bytes
    chunks: tuple[tuple[bytes, int], ...]  # (chunk id, plaintext length), in file order

    def to_bytes(self) -> bytes:
        return self._bytes

    @cached_property
    def _bytes(self) -> bytes:
        """Kept: a save's writer transaction needs the form three times (the entry's
        digest, its stored body, the journal record), ~36 bytes per chunk each time."""
        head = _FILE_HEAD.pack(self.size, self.hash, len(self.chunks))
        return head + b"".join(starmap(_CHUNK.pack, self.chunks))

    @classmethod
    def from_view(cls, view: memoryview) -> tuple[FileEntry, int]:
        """Decode an entry at the start of `view`; return it and the bytes it used."""
        size, digest, count = _FILE_HEAD.unpack_from(view)
        start = _FILE_HEAD.size
        end = start + count * _CHUNK.size
        chunks = tuple(_CHUNK.iter_unpack(view[start:end]))
        return cls(size, bytes(digest), chunks), end

    @classmethod
    def from_bytes(cls, raw: bytes) -> FileEntry:
        """The entry `raw` is exactly (ValueError otherwise), keeping `raw` as its form
        (`to_bytes`): an entry a worker sent is not packed again for its digest, its
        stored body and the journal record."""
        entry, used = cls.from_view(memoryview(raw))
        if used != len(raw):
            raise ValueError(f"an entry of {used} bytes in {len(raw)}")
        entry.__dict__["_bytes"] = raw  # what cached_property `_bytes` would have made
        return entry

    def spans(self) -> Iterator[tuple[bytes, int, int]]:
        """(chunk id, offset in file, length) for every chunk, in order."""
        offset = 0
        for cid, n in self.chunks:
            yield cid, offset, n
            offset += n

    def to_protocol(self) -> ManifestFile:
        """The wire form of GET .../manifest: hex ids with offsets."""
        spans = [ChunkSpan(c.hex(), o, n) for c, o, n in self.spans()]
        return ManifestFile(self.size, self.hash.hex(), spans)

    def to_wire(self) -> dict[str, object]:
        return self.to_protocol().to_wire()


Manifest = Mapping[str, FileEntry]


def encode_manifest(files: Manifest) -> bytes:
    parts = [_COUNT.pack(len(files))]
    for name in sorted(files):
        raw = name.encode()
        parts.append(_NAME_LEN.pack(len(raw)) + raw)
        parts.append(files[name].to_bytes())
    return b"".join(parts)


def _name(view: memoryview, pos: int) -> tuple[str, int]:
    """The length-prefixed file name at `pos`, and where what follows it starts."""
    (n,) = _NAME_LEN.unpack_from(view, pos)
    pos += _NAME_LEN.size
    return bytes(view[pos : pos + n]).decode(), pos + n


def decode_manifest(blob: bytes | memoryview) -> dict[str, FileEntry]:
    view = memoryview(blob)
    (count,) = _COUNT.unpack_from(view)
    pos = _COUNT.size
    files: dict[str, FileEntry] = {}
    for _ in range(count):
        name, pos = _name(view, pos)
        entry, used = FileEntry.from_view(view[pos:])
        files[name] = entry
        pos += used
    return files


def encode_entry_refs(refs: Mapping[str, bytes]) -> bytes:
    """A manifest naming each file's stored entry by its 32-byte digest, files sorted."""
    parts = [_REFS_MAGIC, _COUNT.pack(len(refs))]
    for name in sorted(refs):
        raw = name.encode()
        parts.append(_NAME_LEN.pack(len(raw)) + raw + refs[name])
    return b"".join(parts)


def decode_entry_refs(blob: bytes | memoryview) -> dict[str, bytes] | None:
    """Name -> entry digest for a manifest of entry references; None for a manifest that
    holds its entries whole (written before entries were stored apart: `decode_manifest`)."""
    view = memoryview(blob)
    if bytes(view[: len(_REFS_MAGIC)]) != _REFS_MAGIC:
        return None
    pos = len(_REFS_MAGIC)
    (count,) = _COUNT.unpack_from(view, pos)
    pos += _COUNT.size
    refs: dict[str, bytes] = {}
    for _ in range(count):
        name, pos = _name(view, pos)
        refs[name] = bytes(view[pos : pos + _DIGEST_LEN])
        pos += _DIGEST_LEN
    return refs


def distinct_chunks(files: Manifest) -> set[bytes]:
    return {cid for entry in files.values() for cid, _ in entry.chunks}
