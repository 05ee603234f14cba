from __future__ import annotations

import os

import pytest

from checkpoint_vault.protocol import (
    CHUNK_RECORD_HEAD,
    CHUNK_REFERENCE,
    decode_chunk_batch,
    encode_chunk_batch,
)
from checkpoint_vault.vault import ChunkCorrupt
from checkpoint_vault.vault.frame import (
    CODEC_RAW,
    CODEC_ZSTD,
    HEADER,
    ROOM,
    Decoder,
    Encoder,
    chunk_id,
)


def codec_of(frame: bytes) -> int:
    return int(HEADER.unpack_from(frame)[2])


@pytest.mark.parametrize(
    ("data", "codec"),
    [
        (b"", CODEC_RAW),
        (b"abc", CODEC_RAW),
        (os.urandom(70_000), CODEC_RAW),
        (b"checkpoint " * 5000, CODEC_ZSTD),
    ],
    # ids, not the bytes: random bytes in a test's id differ in each pytest-xdist worker,
    # which then refuses the run ("Different tests were collected")
    ids=["empty", "short", "random", "compressible"],
)
def test_round_trip_picks_codec(data: bytes, codec: int) -> None:
    frame = Encoder().encode(data)
    assert codec_of(frame) == codec
    assert bytes(Decoder().plaintext(frame, chunk_id(data))) == data


def test_frames_built_inside_a_received_batch_body() -> None:
    """A batch body decoded with room: raw frames are built over the record heads, inside
    the body, and every chunk (and every other chunk's bytes) survives it."""
    chunks = [os.urandom(70_000), b"checkpoint " * 5000, b"", os.urandom(100)]
    ids = [chunk_id(c) for c in chunks]
    body = bytearray().join(encode_chunk_batch(list(zip(ids, chunks, strict=True))))
    decoded = decode_chunk_batch(body, ROOM)
    assert [cid for cid, _ in decoded] == ids
    encoder = Encoder()
    spans = [span for _, span in decoded if span is not None]
    frames = [encoder.encode_in_place(span) for span in spans]
    assert [codec_of(bytes(f)) for f in frames] == [CODEC_RAW, CODEC_ZSTD, CODEC_RAW, CODEC_RAW]
    assert isinstance(frames[0], memoryview)
    assert frames[0].obj is body  # no copy
    for data, cid, frame in zip(chunks, ids, frames, strict=True):
        assert bytes(Decoder().plaintext(frame, cid)) == data
        assert bytes(frame) == Encoder().encode(data)  # the same bytes as a copied frame
    with pytest.raises(ValueError, match="room"):
        decode_chunk_batch(body, 37)


def test_a_batch_carries_references_between_chunks() -> None:
    """A reference record names a chunk without its bytes (length CHUNK_REFERENCE)."""
    a, b = os.urandom(1000), os.urandom(2000)
    records: list[tuple[bytes, bytes | None]] = [
        (chunk_id(a), a),
        (chunk_id(b"x"), None),
        (chunk_id(b), b),
        (chunk_id(a), None),
    ]
    body = b"".join(encode_chunk_batch(records))
    assert len(body) == 4 * CHUNK_RECORD_HEAD.size + 3000
    decoded = decode_chunk_batch(body)
    assert [(cid, None if d is None else bytes(d)) for cid, d in decoded] == records
    with pytest.raises(ValueError, match="past the end"):  # a length just under the marker
        decode_chunk_batch(CHUNK_RECORD_HEAD.pack(chunk_id(a), CHUNK_REFERENCE - 1))


@pytest.mark.parametrize("compressible", [True, False])
def test_any_flipped_bit_is_detected(compressible: bool) -> None:
    data = b"weights " * 4000 if compressible else os.urandom(4000)
    frame = bytearray(Encoder().encode(data))
    for pos in (0, 3, HEADER.size + 1, len(frame) // 2, len(frame) - 1):
        damaged = bytearray(frame)
        damaged[pos] ^= 0x10
        with pytest.raises(ChunkCorrupt):
            Decoder().plaintext(bytes(damaged), chunk_id(data))


def test_truncated_frame_is_corrupt() -> None:
    data = os.urandom(1000)
    frame = Encoder().encode(data)
    with pytest.raises(ChunkCorrupt):
        Decoder().plaintext(frame[:-1], chunk_id(data))
    with pytest.raises(ChunkCorrupt):
        Decoder().plaintext(frame[:3], chunk_id(data))
