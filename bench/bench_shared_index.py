"""The two cheapest shapes of a shared chunk index in the object store (issue 44), measured
against a real SeaweedFS on loopback with the same entries:

- `segments` (built: vault/content/shared.py): one immutable segment per pack, listing
  every chunk of it; a reader lists `index/` and fetches the segments it has not seen, then
  answers every lookup from memory.
- `keyshards` (Xet's shape): the same segment per pack, plus one small object
  `keys/<chunk id>` naming it for each *key chunk* (a pack's first chunk, and chunks whose
  id is 0 mod 1024); a reader GETs `keys/<id>` for each key chunk among the ids it is
  asked about and fetches only the segments those name.

Per shape: requests and seconds to publish `--packs` packs, to answer one checkpoint's
`missing` query of chunks all already shipped (a cold reader), and one of `--fresh` chunks
nobody has (the common case of new training state); and bytes held in memory per entry.
Chunk counts follow the large profile (avg 48 KiB: ~680 chunks per 32 MiB pack).

Run: python bench/bench_shared_index.py [--packs 8] [--existing 200]
(`--existing`: segments other checkpoints already put in the index before the query.)
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from checkpoint_vault.tiering import open_tier  # noqa: E402
from checkpoint_vault.vault.content.shared import SharedIndex, decode_segment  # noqa: E402
from checkpoint_vault.vault.errors import ObjectNotFound  # noqa: E402
from checkpoint_vault.vault.tier import Tier  # noqa: E402
from tests.seaweed import SeaweedFS  # noqa: E402

CHUNKS_PER_PACK = (32 << 20) // (48 << 10)
MODULUS = 1024


class Counting:
    """A tier that counts requests (the cost an object store bills)."""

    def __init__(self, tier: Tier) -> None:
        self._t = tier
        self.name = "shared"
        self.requests = 0

    def put(self, key: str, data: bytes | memoryview, *, if_absent: bool = False) -> None:
        self.requests += 1
        self._t.put(key, data, if_absent=if_absent)

    def get(self, key: str) -> bytes:
        self.requests += 1
        return self._t.get(key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self.requests += 1
        return self._t.get_range(key, start, length)

    def head(self, key: str) -> int | None:
        self.requests += 1
        return self._t.head(key)

    def delete(self, key: str) -> None:
        self.requests += 1
        self._t.delete(key)

    def list(self, prefix: str = "") -> Iterator[str]:
        self.requests += 1
        return iter(list(self._t.list(prefix)))


def _pack(n: int) -> list[tuple[bytes, int, int, int, int]]:
    return [(os.urandom(32), i * 49152, 49200, 49152, 0) for i in range(n)]


def _key_chunks(rows: list[tuple[bytes, int, int, int, int]]) -> list[bytes]:
    return [
        r[0]
        for i, r in enumerate(rows)
        if i == 0 or int.from_bytes(r[0][-8:], "little") % MODULUS == 0
    ]


def run(seaweed: SeaweedFS, shape: str, packs: int, existing: int, fresh: int) -> dict[str, float]:
    prefix = f"s3://vault/bench-{secrets.token_hex(4)}"
    tier = Counting(open_tier("shared", prefix, seaweed.options()))
    writer = SharedIndex(tier, "shared", "w0")
    for _ in range(existing):  # what other checkpoints put there before
        rows = _pack(CHUNKS_PER_PACK)
        seg = writer.publish(f"packs/{secrets.token_hex(8)}", rows)
        if shape == "keyshards":
            for cid in _key_chunks(rows):
                tier.put(f"keys/{cid.hex()}", seg.encode())
    out: dict[str, float] = {}
    tier.requests = 0
    start = time.perf_counter()
    ckpt: list[bytes] = []
    for _ in range(packs):
        rows = _pack(CHUNKS_PER_PACK)
        ckpt += [r[0] for r in rows]
        seg = writer.publish(f"packs/{secrets.token_hex(8)}", rows)
        if shape == "keyshards":
            for cid in _key_chunks(rows):
                tier.put(f"keys/{cid.hex()}", seg.encode())
    out["publish_s"] = time.perf_counter() - start
    out["publish_requests"] = tier.requests

    reader = SharedIndex(tier, "shared", "r0")
    tier.requests = 0
    start = time.perf_counter()
    if shape == "segments":
        found = len(reader.lookup(ckpt))
    else:
        found = _keyshard_lookup(tier, reader, ckpt)
    out["hit_query_s"] = time.perf_counter() - start
    out["hit_query_requests"] = tier.requests
    out["hit_found"] = found / len(ckpt)

    new = [os.urandom(32) for _ in range(fresh)]
    tier.requests = 0
    start = time.perf_counter()
    if shape == "segments":
        reader._refreshed = float("-inf")  # a miss past the refresh interval lists again
        reader.lookup(new)
    else:
        _keyshard_lookup(tier, reader, new)
    out["fresh_query_s"] = time.perf_counter() - start
    out["fresh_query_requests"] = tier.requests

    tracemalloc.start()
    held = SharedIndex(tier, "shared", "m0")
    held.refresh()
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    out["memory_bytes_per_entry"] = size / max(1, len(held))
    return out


def _keyshard_lookup(tier: Counting, reader: SharedIndex, ids: list[bytes]) -> int:
    """Xet's query: GET keys/<id> for each key chunk asked about, fetch the segments they
    name; the neighbours then match from those segments."""
    known: set[bytes] = set()
    seen: set[str] = set()
    for cid in ids:
        if cid in known or int.from_bytes(cid[-8:], "little") % MODULUS and cid is not ids[0]:
            continue
        try:
            seg = tier.get(f"keys/{cid.hex()}").decode()
        except ObjectNotFound:
            continue
        if seg in seen:
            continue
        seen.add(seg)
        _, rows = decode_segment(tier.get(seg))
        known.update(r[0] for r in rows)
    return sum(1 for c in ids if c in known)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--packs", type=int, default=8)  # 256 MiB in 32 MiB packs
    p.add_argument("--existing", type=int, default=200)  # 6.4 GB shipped before
    p.add_argument("--fresh", type=int, default=5500)  # 256 MiB of new chunks
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as root:
        seaweed = SeaweedFS(Path(root))
        seaweed.start()
        try:
            for shape in ("segments", "keyshards"):
                r = run(seaweed, shape, args.packs, args.existing, args.fresh)
                print(shape, " ".join(f"{k}={v:.3g}" for k, v in r.items()))
        finally:
            seaweed.stop()


if __name__ == "__main__":
    main()
