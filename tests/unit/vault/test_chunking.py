from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from checkpoint_vault.vault.chunking import LARGE, SMALL, ChunkingProfile, StreamChunker


def whole(profile: ChunkingProfile, data: bytes) -> list[bytes]:
    return [bytes(c.data) for c in profile.chunker().cut_buf(data)]


def streamed(profile: ChunkingProfile, data: bytes, cuts: list[int]) -> list[bytes]:
    chunker = StreamChunker(profile)
    out: list[bytes] = []
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        out.extend(bytes(c) for c in chunker.feed(data[lo:hi], final=False))
    out.extend(bytes(c) for c in chunker.feed(b"", final=True))
    return out


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(0, 60_000),
    seed=st.integers(0, 2**32),
    cuts=st.lists(st.integers(0, 10**9), max_size=8),
)
def test_stream_chunking_equals_whole_buffer_chunking(
    size: int, seed: int, cuts: list[int]
) -> None:
    data = random.Random(seed).randbytes(size)
    assert streamed(SMALL, data, cuts) == whole(SMALL, data)


def test_large_profile_on_megabytes_fed_in_odd_pieces() -> None:
    data = random.Random(7).randbytes(3_000_000)
    cuts = [1, 65_537, 1_000_000, 1_000_001, 2_999_999]
    chunks = streamed(LARGE, data, cuts)
    assert chunks == whole(LARGE, data)
    assert b"".join(chunks) == data
    assert all(len(c) <= LARGE.max_size for c in chunks)


def test_an_edit_changes_only_nearby_chunks() -> None:
    data = bytearray(random.Random(1).randbytes(2_000_000))
    before = set(whole(LARGE, bytes(data)))
    data[1_000_000:1_000_100] = bytes(100)
    after = whole(LARGE, bytes(data))
    assert sum(1 for c in after if c not in before) <= 3
