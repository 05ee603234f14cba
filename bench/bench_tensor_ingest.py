"""Does cutting tensors in fixed pieces change how fast checkpoints are saved? An A/B run.

Run by hand, never by the test suite (needs torch, safetensors, numpy):

    python bench/bench_tensor_ingest.py                 # finetune series, 8 checkpoints
    python bench/bench_tensor_ingest.py --series bf16 --count 6

One server on loopback, one client. The checkpoints of a series (every chunk new) are saved
alternately into two namespaces that differ only in `tensor_pieces`: the `large` profile
(tensors cut in 256 KiB pieces) and the same FastCDC parameters without it (plain CDC).
The order flips every checkpoint, so both see the same mix of warm and cold moments on a
shared, noisy machine. Prints MB/s of each arm and their ratio (the issue asks that ingest
stay within 5%).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench_client import generate, make_client, wait_healthy
from bench_ingest import Server, mb_per_s

CDC = {"min_size": 16384, "avg_size": 49152, "max_size": 262144}  # `large` without pieces


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--series", default="finetune")
    p.add_argument("--count", type=int, default=8)
    p.add_argument("--tmpdir", type=Path, default=None)
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="ckpt-bench-tensor-ingest-", dir=args.tmpdir))
    server = Server(data_dir=tmp / "vault", log_path=tmp / "server.log")
    try:
        ckpts, _ = generate(args.series, tmp / "series", 0, args.count)
        server.start()
        wait_healthy(server)
        client = make_client("vault", server.url, server.token())
        seconds = {"pieces": 0.0, "cdc": 0.0}
        size = 0
        try:
            for ck in ckpts:
                arms = ["pieces", "cdc"] if ck.index % 2 == 0 else ["cdc", "pieces"]
                for arm in arms:
                    chunking = "large" if arm == "pieces" else CDC
                    start = time.perf_counter()
                    client.save(f"ab/{arm}", ck.payload(), chunking=chunking)
                    seconds[arm] += time.perf_counter() - start
                size += ck.size
        finally:
            client.close()
        pieces, cdc = (mb_per_s(size, seconds[a]) for a in ("pieces", "cdc"))
        print(f"{args.series}: {len(ckpts)} checkpoints, {size / 1e6:.1f} MB per arm")
        print(
            f"tensor pieces: {pieces:.1f} MB/s, plain FastCDC: {cdc:.1f} MB/s, "
            f"ratio {pieces / cdc:.3f}"
        )
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
