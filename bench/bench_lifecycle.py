"""Lifecycle costs on a real engine: plan, apply, GC and verify over many checkpoints.

Builds N checkpoints across M namespaces (each a file sharing most bytes with the
namespace's previous checkpoint, plus some new ones, stored through upload sessions so the
frames land in the frame store as producers' would), sets a keep_last policy, then times:
the retention plan (dry run), applying it, GC of what it freed, and a full verify.
Run: python bench/bench_lifecycle.py [--checkpoints 1000] [--namespaces 10] [--keep 20]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

from checkpoint_vault.vault import FakeClock, Vault, VaultConfig

FILE = 1 << 20  # bytes per checkpoint file
NEW = 96 << 10  # bytes that change between consecutive checkpoints of a namespace


def build(vault: Vault, clock: FakeClock, checkpoints: int, namespaces: int, seed: int) -> int:
    rng = random.Random(seed)
    state = {f"bench/ns{i}": bytearray(rng.randbytes(FILE)) for i in range(namespaces)}
    logical = 0
    for n in range(checkpoints):
        ns = f"bench/ns{n % namespaces}"
        data = state[ns]
        at = rng.randrange(0, FILE - NEW)
        data[at : at + NEW] = rng.randbytes(NEW)
        session, _ = vault.open_upload(
            ns, parent="latest" if n >= namespaces else None, metadata={"step": n}
        )
        ingest = vault.ingest(session.id, "model.bin")
        ingest.feed(bytes(data), final=True)
        ingest.finish()
        vault.committer.commit(session.id)
        logical += len(data)
        clock.advance(60)
    return logical


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=1000)
    parser.add_argument("--namespaces", type=int, default=10)
    parser.add_argument("--keep", type=int, default=20, help="keep_last per namespace")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tmpdir", default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ckpt-bench-life-", dir=args.tmpdir))
    clock = FakeClock()
    vault = Vault(root / "vault", VaultConfig(gc_grace=0.0, upload_ttl=1.0), clock)
    try:
        t = time.perf_counter()
        logical = build(vault, clock, args.checkpoints, args.namespaces, args.seed)
        figures: dict[str, float | int] = {
            "build_s": time.perf_counter() - t,
            "logical_bytes": logical,
        }
        vault.set_policy(None, {"retention": {"keep_last": args.keep}})
        clock.advance(10)
        t = time.perf_counter()
        plan = vault.retention(dry_run=True)
        figures["plan_s"] = time.perf_counter() - t
        figures["plan_delete"] = len(plan.delete)
        figures["reclaimable_bytes"] = plan.reclaimable_bytes
        t = time.perf_counter()
        applied = vault.retention(dry_run=False)
        figures["apply_s"] = time.perf_counter() - t
        figures["deleted"] = len(applied.deleted)
        t = time.perf_counter()
        gc = vault.gc()
        figures["gc_s"] = time.perf_counter() - t
        figures["gc_chunks"] = gc.chunks_deleted
        figures["gc_bytes"] = gc.bytes_freed
        t = time.perf_counter()
        report = vault.verify()
        figures["verify_s"] = time.perf_counter() - t
        figures["verify_bytes"] = report.bytes_checked
        figures["verify_mb_s"] = report.mb_per_s
        figures["check_ok"] = int(vault.check().ok)
    finally:
        vault.close()
        shutil.rmtree(root, ignore_errors=True)
    for key, value in figures.items():
        print(f"{key:20} {value:,.3f}" if isinstance(value, float) else f"{key:20} {value:,}")
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
