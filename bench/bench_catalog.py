"""Catalog backup and restore time for a catalog of N checkpoints (default 10,000 small
ones across 10 namespaces). Run: python bench/bench_catalog.py [--checkpoints 10000]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from checkpoint_vault.vault import Vault
from checkpoint_vault.vault.backup import restore_catalog


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=10_000)
    parser.add_argument("--tmpdir", default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ckpt-bench-catalog-", dir=args.tmpdir))
    try:
        vault = Vault(root / "a")
        started = time.perf_counter()
        for i in range(args.checkpoints):
            state = f'{{"step": {i}, "notes": "{"y" * 800}"}}'.encode()
            vault.save(f"ns{i % 10}", {"state.json": state}, chunking="small")
        build = time.perf_counter() - started
        started = time.perf_counter()
        size = vault.backup_catalog(root / "catalog.mdb")
        backup = time.perf_counter() - started
        vault.close()
        started = time.perf_counter()
        restore_catalog(root / "catalog.mdb", root / "b" / "vault")
        restore = time.perf_counter() - started
        restored = Vault(root / "b" / "vault")
        count = restored.stats().checkpoints
        restored.close()
        print(f"checkpoints        {args.checkpoints:,} (built in {build:.1f} s)")
        print(f"catalog copy       {size / 1e6:.1f} MB")
        print(f"backup             {backup:.3f} s")
        print(f"restore            {restore:.3f} s ({count:,} checkpoints after)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
