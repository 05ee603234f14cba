"""Tensor-aligned chunking: tensors found by format, cut in fixed pieces from their start,
the same cuts whatever the pieces the stream arrives in."""

from __future__ import annotations

import io
import random

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save as save_safetensors

from checkpoint_vault.protocol import ChunkingProfile, StreamChunker, tensor_regions
from checkpoint_vault.vault.chunking import LARGE, cut_whole

PIECE = 4096
PROFILE = ChunkingProfile("t", 512, 1024, 4096, tensor_pieces=PIECE)


def torch_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    buf = io.BytesIO()
    torch.save(tensors, buf)
    return buf.getvalue()


def weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "emb": rng.standard_normal((300, 64)).astype(np.float32),
        "bias": rng.standard_normal(10).astype(np.float32),
        "proj": rng.standard_normal((64, 129)).astype(np.float32),
    }


def test_torch_save_regions_are_the_tensors_bytes() -> None:
    w = weights(0)
    data = torch_bytes({k: torch.from_numpy(v) for k, v in w.items()})
    regions = tensor_regions(io.BytesIO(data), len(data), PIECE)
    found = sorted(data[s:e] for s, e in regions)
    assert found == sorted(v.tobytes() for v in w.values() if v.nbytes >= PIECE)


def test_safetensors_regions_are_the_tensors_bytes() -> None:
    w = weights(1)
    data = save_safetensors(w)
    regions = tensor_regions(io.BytesIO(data), len(data), PIECE)
    assert sorted(data[s:e] for s, e in regions) == sorted(
        v.tobytes() for v in w.values() if v.nbytes >= PIECE
    )


def test_other_files_and_broken_tensor_files_have_no_regions() -> None:
    for data in (b"", b"hello", b"PK\x03\x04 not really a zip", b"\x10" + b"\0" * 7 + b"{bad"):
        assert tensor_regions(io.BytesIO(data), len(data), PIECE) == []


def test_the_same_piece_of_a_changed_tensor_lines_up_across_versions() -> None:
    """Every float changed: no chunk is shared, but every tensor piece has a counterpart
    of the same length at the same offset, and unchanged tensors dedup."""
    a = weights(2)
    b = {k: (v * 1.001 if k == "emb" else v) for k, v in a.items()}
    files = [torch_bytes({k: torch.from_numpy(v) for k, v in w.items()}) for w in (a, b)]
    cuts = []
    for data in files:
        regions = tensor_regions(io.BytesIO(data), len(data), PIECE)
        chunks = StreamChunker(PROFILE, regions=regions).feed(data, True)
        assert b"".join(chunks) == data
        offsets, at = [], 0
        for c in chunks:
            offsets.append((at, len(c), bytes(c)))
            at += len(c)
        cuts.append(offsets)
    emb_start = files[0].index(a["emb"].tobytes())
    old = {(o, n): c for o, n, c in cuts[0] if emb_start <= o < emb_start + a["emb"].nbytes}
    new = {(o, n): c for o, n, c in cuts[1]}
    assert len(old) == -(-a["emb"].nbytes // PIECE)
    assert all(k in new and new[k] != c for k, c in old.items())
    assert a["proj"].tobytes()[:PIECE] in {c for _, _, c in cuts[1]}  # unchanged: shared


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), splits=st.lists(st.integers(1, 60_000), max_size=10))
def test_region_chunking_is_the_same_however_the_stream_is_fed(
    seed: int, splits: list[int]
) -> None:
    rnd = random.Random(seed)
    data = rnd.randbytes(rnd.randint(0, 60_000))
    points = sorted({rnd.randint(0, len(data)) for _ in range(6)})
    regions = [(points[i], points[i + 1]) for i in range(0, len(points) - 1, 2)]
    regions = [r for r in regions if r[1] > r[0]]
    cuts = [rnd.randint(1, max(1, len(data))) for _ in range(2)]
    whole = [bytes(c) for c in StreamChunker(PROFILE, cuts, regions).feed(data, True)]
    chunker = StreamChunker(PROFILE, cuts, regions)
    fed: list[bytes] = []
    bounds = sorted({0, len(data), *(s % (len(data) + 1) for s in splits)})
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        fed.extend(bytes(c) for c in chunker.feed(data[lo:hi], final=False))
    fed.extend(bytes(c) for c in chunker.feed(b"", final=True))
    assert fed == whole
    assert b"".join(whole) == data
    for start, end in regions:  # region bytes are cut in fixed pieces from their start
        at = 0
        edges = set()
        for c in whole:
            at += len(c)
            edges.add(at)
        assert all(p in edges for p in range(start + PIECE, end, PIECE) if p not in cuts)
        assert start in edges or start == 0
        assert end in edges


def test_server_direct_saves_cut_tensors_the_same_way() -> None:
    data = save_safetensors(weights(3))
    regions = tensor_regions(io.BytesIO(data), len(data), LARGE.tensor_pieces)
    client = StreamChunker(LARGE, regions=regions).feed(data, True)
    assert [bytes(c) for c in cut_whole(LARGE, data)] == [bytes(c) for c in client]
