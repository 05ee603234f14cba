"""Reading chunks back: a small read is decoded on the calling thread (handing 17 chunks of
an agent's state to the decoder threads and back cost more than decoding them), a large
one side by side on the decoder threads; both give the bytes saved."""

from __future__ import annotations

import os
from typing import Any

import pytest

from checkpoint_vault.vault import Vault


def _read(vault: Vault, ns: str, cid: str) -> bytes:
    _, files = vault.manifest(ns, cid)
    chunks = [c for c, _ in files["f"].chunks]
    return b"".join(bytes(c) for c in vault.reader.chunks(chunks))


@pytest.mark.parametrize(("size", "threads"), [(40_000, False), (2_000_000, True)])
def test_reads_use_the_decoder_threads_only_when_large(
    vault: Vault, monkeypatch: pytest.MonkeyPatch, size: int, threads: bool
) -> None:
    data = os.urandom(size // 2) * 2  # compressible halves: zstd frames and raw ones
    rec, _ = vault.save("ns", {"f": data}, chunking="small")
    pool = vault.store.runtime.decode
    handed: list[int] = []
    real = pool.map

    def spy(fn: Any, *parts: Any, **kw: Any) -> Any:
        handed.append(len(parts[0]))
        return real(fn, *parts, **kw)

    monkeypatch.setattr(pool, "map", spy)
    assert _read(vault, "ns", rec.id) == data
    assert bool(handed) == threads
