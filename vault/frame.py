"""Chunk frames: the self-describing byte form a chunk is stored in.

Layout (little endian): magic b"CV", format version (1 byte), codec (1 byte: 0 raw, 1 zstd),
flags (1 byte: bit 0 sealed), plaintext length (4 bytes), payload. A sealed frame's payload
is the key id, nonce and AES-GCM ciphertext of the plain payload, with the header and the
chunk id as associated data (see `seal.py`); frames are sealed only on their way out of the
hot store, and opened on the way back in, so only plain frames reach `Decoder`. A chunk is
stored zstd-compressed only when that saves at least 1/16 of its size: incompressible data
(random, already-compressed) is stored raw and costs nothing to read back; so are chunks
whose 4 KiB sample compresses by less than 1/8 (fp32 weights), see `_worth_trying`. Decoding always
re-hashes the plaintext and compares it with the chunk id, so no corrupted byte can leave
the engine.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import blake3
import zstandard

from .errors import ChunkCorrupt, KeyUnavailable
from .seal import Keyring

MAGIC = b"CV"
VERSION = 1
CODEC_RAW = 0
CODEC_ZSTD = 1
HEADER = struct.Struct("<2sBBBI")
ZSTD_LEVEL = 1  # ~0.7 GB/s on fp32 weights here; higher levels gain <1% on tensors.
MIN_SAVING_FRACTION = 16  # store compressed only if it saves >= 1/16 of the bytes
SAMPLE = 4096  # bytes compressed first to decide whether a large chunk is worth it
FLAG_SEALED = 1
_FLAGS_AT = 4


def chunk_id(data: bytes | memoryview) -> bytes:
    return blake3.blake3(data).digest()


class Encoder:
    """Builds frames; holds one zstd context, so use one per thread."""

    def __init__(self) -> None:
        self._zstd = zstandard.ZstdCompressor(level=ZSTD_LEVEL)

    def encode(self, data: bytes | memoryview) -> bytes:
        n = len(data)
        if n >= 64 and self._worth_trying(data):
            packed = self._zstd.compress(data)
            if len(packed) <= n - n // MIN_SAVING_FRACTION:
                return HEADER.pack(MAGIC, VERSION, CODEC_ZSTD, 0, n) + packed
        return b"".join((HEADER.pack(MAGIC, VERSION, CODEC_RAW, 0, n), data))

    def _worth_trying(self, data: bytes | memoryview) -> bool:
        """Compress a 4 KiB sample first: fp32 weights save ~8% at ~0.7 GB/s of CPU on
        ingest and again on every read, which costs more than it saves here; a sample that
        saves under 1/8 says the chunk is not worth it (bf16 and text save 20% and more)."""
        if len(data) < 4 * SAMPLE:
            return True
        mid = len(data) // 2
        sample = self._zstd.compress(memoryview(data)[mid : mid + SAMPLE])
        return len(sample) <= SAMPLE - SAMPLE // 8


class Decoder:
    """Opens frames and verifies them; holds one zstd context, so use one per thread."""

    def __init__(self) -> None:
        self._zstd = zstandard.ZstdDecompressor()

    def plaintext(
        self, frame: bytes | memoryview, expected_id: bytes, verify: bool = True
    ) -> bytes | memoryview:
        """The verified plaintext of `frame`; raises ChunkCorrupt on any mismatch.

        A raw frame's plaintext is returned as a view into `frame` (no copy). `verify=False`
        skips only the hash, for callers that hash the bytes themselves anyway.
        """
        view = memoryview(frame)
        try:
            magic, version, codec, flags, n = HEADER.unpack_from(view)
        except struct.error:
            raise ChunkCorrupt(expected_id.hex()) from None
        if magic != MAGIC or version != VERSION or flags & FLAG_SEALED:
            raise ChunkCorrupt(expected_id.hex())
        payload = view[HEADER.size :]
        data: bytes | memoryview
        if codec == CODEC_RAW:
            data = payload
        elif codec == CODEC_ZSTD:
            try:
                data = self._zstd.decompress(payload, max_output_size=n)
            except zstandard.ZstdError:
                raise ChunkCorrupt(expected_id.hex()) from None
        else:
            raise ChunkCorrupt(expected_id.hex())
        if len(data) != n or (verify and blake3.blake3(data).digest() != expected_id):
            raise ChunkCorrupt(expected_id.hex())
        return data


def seal_frame(keyring: Keyring, frame: bytes | memoryview, cid: bytes) -> bytes:
    """The frame with its payload encrypted; the header stays readable (it says the frame
    is sealed, and the plaintext length, which chunk boundaries reveal anyway)."""
    header = bytearray(frame[: HEADER.size])
    header[_FLAGS_AT] |= FLAG_SEALED
    return bytes(header) + keyring.seal(memoryview(frame)[HEADER.size :], bytes(header) + cid)


def open_frame(keyring: Keyring | None, frame: bytes, cid: bytes) -> bytes:
    """A plain frame back from a sealed one (plain ones pass through). Raises SealBroken
    if a byte changed or the frame belongs to another chunk, KeyUnavailable if this
    server lacks the key."""
    if len(frame) < HEADER.size or not frame[_FLAGS_AT] & FLAG_SEALED:
        return frame
    if keyring is None:
        raise KeyUnavailable("a chunk is encrypted and no key file is configured")
    header = frame[: HEADER.size]
    payload = keyring.open(memoryview(frame)[HEADER.size :], header + cid)
    plain_header = bytearray(header)
    plain_header[_FLAGS_AT] &= ~FLAG_SEALED
    return bytes(plain_header) + payload


def plaintext_length(frame: bytes | memoryview) -> int:
    return int(HEADER.unpack_from(frame)[4])


def hash_all(parts: Iterable[bytes | memoryview]) -> bytes:
    h = blake3.blake3()
    for p in parts:
        h.update(p)
    return h.digest()
