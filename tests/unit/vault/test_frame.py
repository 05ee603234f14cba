from __future__ import annotations

import os

import pytest

from vault import ChunkCorrupt
from vault.frame import CODEC_RAW, CODEC_ZSTD, HEADER, Decoder, Encoder, chunk_id


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
)
def test_round_trip_picks_codec(data: bytes, codec: int) -> None:
    frame = Encoder().encode(data)
    assert codec_of(frame) == codec
    assert bytes(Decoder().plaintext(frame, chunk_id(data))) == data


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
