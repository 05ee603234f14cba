"""Chunk frames: the self-describing byte form a chunk is stored in.

Layout (little endian): magic b"CV", format version (1 byte), codec (1 byte), flags (1 byte:
bit 0 sealed), plaintext length (4 bytes), payload. Codecs:

| codec | payload |
|---|---|
| 0 raw | the plaintext |
| 1 zstd | zstd(plaintext) |
| 2 grouped | width (1 byte), zstd(byte-grouped plaintext) |
| 3 delta | base chunk id (32 bytes), width (1 byte), zstd(byte-grouped (plaintext XOR base)) |
| 4 patch | base chunk id (32 bytes), zstd(plaintext), the base's plaintext its raw dictionary |

Byte grouping (numcodecs' Shuffle) puts every element's first byte together, then every
second byte...: the sign and exponent bytes of tensors are alike, so they compress, where
zstd alone sees noise. A delta names its base by id: the base is any stored chunk of the
same length (the same piece of the same tensor in a newer checkpoint, see compact.py), and
its plaintext is verified before it is used. Raw and zstd are chosen at ingest; grouped and
delta only by compaction, off the save path. A patch is the one delta ingest writes: a small
file saved in one request is one chunk (vault/smallfile.py), and the same file's chunk in the
parent is its base, of any length: zstd finds the bytes the two share (an agent's state that
grew by a message patches to ~0.4 kB where the whole state is ~9 kB of zstd).

A sealed frame's payload is the key id, nonce and AES-GCM ciphertext of the plain payload,
with the header and the chunk id as associated data (see `seal.py`); frames are sealed only
on their way out of the hot store, and opened on the way back in, so only plain frames
reach `Decoder`. A chunk is stored zstd-compressed only when that saves at least 1/16 of
its size: incompressible data (random, already-compressed) is stored raw and costs nothing
to read back; so are chunks whose 4 KiB sample compresses by less than 1/8 (fp32 weights),
see `_worth_trying`. Decoding always re-hashes the plaintext and compares it with the chunk
id, so no corrupted byte can leave the engine.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

import blake3
import zstandard

from .errors import ChunkCorrupt, KeyUnavailable
from .seal import Keyring

MAGIC = b"CV"
VERSION = 1
CODEC_RAW = 0
CODEC_ZSTD = 1
CODEC_GROUPED = 2
CODEC_DELTA = 3
CODEC_PATCH = 4
CODEC_NAMES = {
    CODEC_RAW: "raw",
    CODEC_ZSTD: "zstd",
    CODEC_GROUPED: "grouped",
    CODEC_DELTA: "delta",
    CODEC_PATCH: "patch",
}
_BASED = (CODEC_DELTA, CODEC_PATCH)  # codecs whose payload starts with a base chunk id
ID_BYTES = 32
WIDTHS = (2, 4, 8)  # element widths byte grouping is tried with: bf16/fp16, fp32, fp64/int64
HEADER = struct.Struct("<2sBBBI")
ZSTD_LEVEL = 1  # ~0.7 GB/s on fp32 weights here; higher levels gain <1% on tensors.
MIN_SAVING_FRACTION = 16  # store compressed only if it saves >= 1/16 of the bytes
SAMPLE = 4096  # bytes compressed first to decide whether a large chunk is worth it
FLAG_SEALED = 1
_FLAGS_AT = 4
ROOM = HEADER.size  # spare bytes before a received chunk that let its raw frame be built in place


def chunk_id(data: bytes | memoryview) -> bytes:
    return blake3.blake3(data).digest()


class Encoder:
    """Builds frames; holds one zstd context, so use one per thread."""

    def __init__(self) -> None:
        self._zstd = zstandard.ZstdCompressor(level=ZSTD_LEVEL)

    def encode(self, data: bytes | memoryview) -> bytes:
        packed = self._packed(data)
        if packed is not None:
            return packed
        return b"".join((HEADER.pack(MAGIC, VERSION, CODEC_RAW, 0, len(data)), data))

    def patch(self, data: bytes | memoryview, base_id: bytes, base: bytes | memoryview) -> bytes:
        """The patch frame of `data` against the verified plaintext `base` of chunk
        `base_id` (zstd with `base` as its raw-content dictionary)."""
        if len(base_id) != ID_BYTES:
            raise ValueError("a patch names its base by its id")
        packer = zstandard.ZstdCompressor(level=ZSTD_LEVEL, dict_data=_raw_dict(base))
        head = HEADER.pack(MAGIC, VERSION, CODEC_PATCH, 0, len(data))
        return b"".join((head, base_id, packer.compress(data)))

    def encode_in_place(self, span: memoryview) -> bytes | memoryview:
        """The frame of the chunk `span[ROOM:]`, where `span` is writable: a raw frame is
        `span` itself with its header written into the first ROOM bytes (no copy of the
        chunk; a received batch body provides the room, see `decode_chunk_batch`)."""
        data = span[ROOM:]
        packed = self._packed(data)
        if packed is not None:
            return packed
        HEADER.pack_into(span, 0, MAGIC, VERSION, CODEC_RAW, 0, len(data))
        return span

    def _packed(self, data: bytes | memoryview) -> bytes | None:
        """The zstd frame of `data` if compressing it is worth it, else None (stored raw)."""
        n = len(data)
        if n >= 64 and self._worth_trying(data):
            packed = self._zstd.compress(data)
            if len(packed) <= n - n // MIN_SAVING_FRACTION:
                return HEADER.pack(MAGIC, VERSION, CODEC_ZSTD, 0, n) + packed
        return None

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
        self,
        frame: bytes | memoryview,
        expected_id: bytes,
        verify: bool = True,
        base: bytes | memoryview | None = None,
    ) -> bytes | memoryview:
        """The verified plaintext of `frame`; raises ChunkCorrupt on any mismatch.

        A raw frame's plaintext is returned as a view into `frame` (no copy). `verify=False`
        skips only the hash, for callers that hash the bytes themselves anyway. A delta
        frame needs its base's verified plaintext (`delta_base` names it); a delta is always
        verified, since a wrong base would otherwise go unnoticed.
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
            data = self._unzstd(payload, n, expected_id)
        elif codec == CODEC_GROUPED and len(payload) >= 1:
            data = _ungroup(self._unzstd(payload[1:], n, expected_id), payload[0])
        elif codec == CODEC_DELTA and len(payload) > ID_BYTES and base is not None:
            if len(base) != n:
                raise ChunkCorrupt(expected_id.hex())
            width = payload[ID_BYTES]
            diff = _ungroup(self._unzstd(payload[ID_BYTES + 1 :], n, expected_id), width)
            data, verify = _xor(diff, base), True
        elif codec == CODEC_PATCH and len(payload) > ID_BYTES and base is not None:
            data, verify = _unpatch(payload[ID_BYTES:], base, n, expected_id), True
        else:
            raise ChunkCorrupt(expected_id.hex())
        if len(data) != n or (verify and blake3.blake3(data).digest() != expected_id):
            raise ChunkCorrupt(expected_id.hex())
        return data

    def chain(self, frames: list[bytes], expected_id: bytes) -> memoryview | None:
        """The plaintext of a delta chain read at once: `frames` are the delta, its base,
        that one's base... down to a whole frame. XOR and byte grouping commute, so the
        grouped diffs are XORed together (with the whole chunk's grouped form when it is
        grouped alike), ungrouped once and XORed with the whole chunk's plaintext
        otherwise, instead of decoding, ungrouping and hashing every base on the way (a
        read of the oldest checkpoint decodes up to 8 levels). Only the result is
        verified: None when it does not match (or the chain mixes element widths), and the
        caller decodes level by level to find which frame is damaged."""
        import numpy as np

        if frames and frame_codec(frames[0]) == CODEC_PATCH:
            return self._patches(frames, expected_id)
        try:
            n = plaintext_length(frames[0])
            width = frames[0][HEADER.size + ID_BYTES]
            parts: list[bytes] = []  # grouped diffs, and the grouped whole chunk
            whole: bytes | memoryview | None = None  # or the whole chunk's plaintext
            for frame in frames:
                codec = frame_codec(frame)
                view = memoryview(frame)[HEADER.size :]
                if codec == CODEC_DELTA and view[ID_BYTES] == width:
                    parts.append(self._unzstd(view[ID_BYTES + 1 :], n, expected_id))
                    continue
                if codec == CODEC_GROUPED and view[0] == width:
                    parts.append(self._unzstd(view[1:], n, expected_id))
                elif codec in (CODEC_RAW, CODEC_ZSTD):
                    whole = self.plaintext(frame, expected_id, verify=False)
                else:
                    return None  # widths differ along the chain
                break
            else:
                return None  # no whole frame at the end
            if any(len(p) != n for p in parts) or (whole is not None and len(whole) != n):
                return None
            acc = np.frombuffer(parts[0], dtype=np.uint8)
            if len(parts) > 1:
                acc = acc.copy()
                for part in parts[1:]:
                    np.bitwise_xor(acc, np.frombuffer(part, dtype=np.uint8), out=acc)
            data = _ungroup_array(acc, width)
            if whole is not None:
                np.bitwise_xor(data, np.frombuffer(whole, dtype=np.uint8), out=data)
        except (ChunkCorrupt, struct.error, IndexError):
            return None
        if blake3.blake3(data).digest() != expected_id:
            return None
        return memoryview(data)

    def _patches(self, frames: list[bytes], expected_id: bytes) -> memoryview | None:
        """A chain of patches (newest first) down to a whole frame: decoded from the whole
        end up, only the result verified; None where that fails (the caller then decodes
        level by level, verifying each, to find the damaged frame)."""
        *patches, whole = frames
        try:
            if any(frame_codec(f) != CODEC_PATCH for f in patches):
                return None
            data = self.plaintext(whole, expected_id, verify=False)
            for frame in reversed(patches):
                payload = memoryview(frame)[HEADER.size + ID_BYTES :]
                data = _unpatch(payload, data, plaintext_length(frame), expected_id)
        except (ChunkCorrupt, struct.error, IndexError):
            return None
        if blake3.blake3(data).digest() != expected_id:
            return None
        return memoryview(data)

    def _unzstd(self, payload: memoryview, n: int, expected_id: bytes) -> bytes:
        try:
            return self._zstd.decompress(payload, max_output_size=n)
        except zstandard.ZstdError:
            raise ChunkCorrupt(expected_id.hex()) from None


class Recoder:
    """Builds the frames compaction rewrites chunks into (grouped, delta); one per thread.

    The element width is not known at rest (a chunk is bytes), so each candidate width is
    tried on a sample and the smallest wins: a bf16 tensor groups best by 2, fp32 by 4.
    """

    def __init__(self, level: int = ZSTD_LEVEL) -> None:
        self._zstd = zstandard.ZstdCompressor(level=level)

    def grouped(self, data: bytes | memoryview, width: int | None = None) -> bytes:
        n = len(data)
        width = width or self.best_width(data)
        body = self._zstd.compress(_group(data, width))
        return HEADER.pack(MAGIC, VERSION, CODEC_GROUPED, 0, n) + bytes((width,)) + body

    def delta(
        self,
        data: bytes | memoryview,
        base_id: bytes,
        base: bytes | memoryview,
        width: int | None = None,
    ) -> bytes:
        """`width`: the element width to group by (a chain of one width decodes in one
        pass, see `Decoder.chain`); None to pick the best for this chunk."""
        if len(base) != len(data) or len(base_id) != ID_BYTES:
            raise ValueError("a delta needs a base of the same length, named by its id")
        diff = _xor(data, base)
        width = width or self.best_width(diff)
        body = self._zstd.compress(_group(diff, width))
        head = HEADER.pack(MAGIC, VERSION, CODEC_DELTA, 0, len(data))
        return b"".join((head, base_id, bytes((width,)), body))

    def best_width(self, data: bytes | memoryview) -> int:
        """The width whose grouping compresses a 16 KiB sample best; 4 (fp32) unless
        another saves more than 2%."""
        mid = max(0, len(data) // 2 - 2 * SAMPLE)
        sample = memoryview(data)[mid : mid + 4 * SAMPLE]
        sizes = {w: len(self._zstd.compress(_group(sample, w))) for w in WIDTHS}
        best = min(WIDTHS, key=lambda w: (sizes[w], w))
        return best if sizes[best] < sizes[4] * 0.98 else 4


def _raw_dict(base: bytes | memoryview) -> zstandard.ZstdCompressionDict:
    return zstandard.ZstdCompressionDict(bytes(base), dict_type=zstandard.DICT_TYPE_RAWCONTENT)


def _unpatch(payload: memoryview, base: bytes | memoryview, n: int, expected_id: bytes) -> bytes:
    """A patch's plaintext from its payload and its base's plaintext (not yet verified)."""
    try:
        out = zstandard.ZstdDecompressor(dict_data=_raw_dict(base)).decompress(
            payload, max_output_size=n
        )
    except zstandard.ZstdError:
        raise ChunkCorrupt(expected_id.hex()) from None
    if len(out) != n:
        raise ChunkCorrupt(expected_id.hex())
    return out


def _shuffle(width: int) -> Any:
    # 0.17 s to import: only servers that read or write recoded frames pay it
    from numcodecs import Shuffle  # type: ignore[import-untyped]

    return Shuffle(width)


def _group(data: bytes | memoryview, width: int) -> bytes:
    """Byte-group the whole elements; a tail shorter than one element stays as it is."""
    whole = len(data) - len(data) % width
    view = memoryview(data)
    return bytes(_shuffle(width).encode(view[:whole])) + bytes(view[whole:])


def _ungroup(data: bytes, width: int) -> bytes:
    import numpy as np

    return bytes(_ungroup_array(np.frombuffer(data, dtype=np.uint8), width).data)


def _xor(a: bytes | memoryview, b: bytes | memoryview) -> bytes:
    import numpy as np

    x = np.frombuffer(a, dtype=np.uint8)
    y = np.frombuffer(b, dtype=np.uint8)
    return np.bitwise_xor(x, y).tobytes()


def _ungroup_array(grouped: Any, width: int) -> Any:
    """`_ungroup` from one numpy array into a new one, without intermediate copies."""
    import numpy as np

    if width not in WIDTHS:
        raise ChunkCorrupt("unknown element width")
    out = np.empty(len(grouped), dtype=np.uint8)
    whole = len(grouped) - len(grouped) % width
    _shuffle(width).decode(grouped[:whole], out=out[:whole])
    out[whole:] = grouped[whole:]
    return out


def frame_codec(frame: bytes | memoryview) -> int:
    return int(HEADER.unpack_from(frame)[2])


def raw_payload(frame: bytes | memoryview) -> memoryview | None:
    """The plaintext of a whole, unsealed raw frame as a view into it (no copy, nothing
    verified); None for any other frame. For readers that hash or send the bytes anyway."""
    view = memoryview(frame)
    if len(view) < HEADER.size:
        return None
    magic, version, codec, flags, n = HEADER.unpack_from(view)
    if magic != MAGIC or version != VERSION or codec != CODEC_RAW or flags & FLAG_SEALED:
        return None
    payload = view[HEADER.size :]
    return payload if len(payload) == n else None


def delta_base(frame: bytes | memoryview) -> bytes | None:
    """The id of the chunk a plain delta or patch frame is encoded against; None for other
    frames."""
    if len(frame) < HEADER.size + ID_BYTES or frame_codec(frame) not in _BASED:
        return None
    return bytes(memoryview(frame)[HEADER.size : HEADER.size + ID_BYTES])


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
