"""Reads through `vault://` (client.fsspec) against `VaultClient` in the same run.

Starts a real `ckpt serve` on a free loopback port in a temp dir (removed at the end),
saves a random blob (`--size`, default 256MiB) and a `torch.save` of a ~201 MB state_dict
(48 float32 tensors of 4 MiB), then measures, best of `--repeat`:

- byte reads of the blob, as MB/s and as a ratio to `VaultClient.read_range` of the whole
  file in one request: `fs.cat_file`, `fs.open(...).read()`, `VaultClient.open` and
  `fs.open` read in 64 KiB pieces (the latter with 1, 4 and 16 MiB blocks);
- 4 KiB reads at random offsets through `fs.open` per block size, against
  `VaultClient.read_range` of the same 4 KiB (a random read costs one whole block);
- `torch.load(..., weights_only=True)` of the state_dict through `fs.open` per block size,
  and through `fs.open(...).read()` into a BytesIO, against `torch.load(VaultClient.open)`;
- the latency of `fs.cat_file` of a 200-byte file against `VaultClient.read_range` (the
  filesystem resolves the ref first: one more small request).

Run by hand, never by the test suite (needs torch and fsspec):

    python bench/bench_fsspec.py
    python bench/bench_fsspec.py --size 64MiB --repeat 5

MB = 10^6 bytes. Server and client share the machine's cores over loopback; figures move
between runs on a shared machine, so compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import io
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fsspec  # noqa: E402
import torch  # noqa: E402

from checkpoint_vault.client import VaultClient  # noqa: E402
from tests.serverproc import ServerProcess, free_port  # noqa: E402

MB = 1e6
PIECE = 64 << 10  # read size of the "64 KiB reads" rows: a consumer reading in pieces
BLOCKS = (1 << 20, 4 << 20, 16 << 20)  # fsspec block sizes compared (4 MiB is the default)
TENSORS = 48  # x 1024 x 1024 float32: a ~201 MB torch.save
SMALL = b"{}" * 100  # a 200-byte file, as agent state or a small config would be
SMALL_READS = 200
NS_BLOB, NS_SMALL = "bench/fs", "bench/small"


def parse_size(text: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for unit, mult in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * mult)
    return int(text)


def best(fn: Callable[[], Any], repeat: int) -> float:
    """Fastest of `repeat` runs, in seconds: the least disturbed by other work."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def random_bytes(size: int, seed: int) -> bytes:
    rng = random.Random(seed)  # randbytes overflows past 256 MiB in one call: 8 MiB pieces
    return b"".join(rng.randbytes(min(8 << 20, size - i)) for i in range(0, size, 8 << 20))


def drain(f: Any) -> None:
    while f.read(PIECE):
        pass


def state_dict_bytes(seed: int) -> bytes:
    gen = torch.Generator().manual_seed(seed)
    state = {f"layer{i}.weight": torch.randn(1024, 1024, generator=gen) for i in range(TENSORS)}
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def print_rows(rows: list[tuple[str, float]], size: int, base: float, against: str) -> None:
    for name, seconds in rows:
        print(f"  {name:48s} {size / MB / seconds:8.1f} MB/s  {base / seconds:5.2f}x {against}")


def print_latency(name: str, seconds: float, base: float) -> None:
    print(f"  {name:48s} {seconds * 1e3:8.2f} ms  {seconds / base:5.2f}x the baseline's time")


def byte_reads(vault: VaultClient, fs: Any, size: int, repeat: int) -> None:
    path = f"{NS_BLOB}/latest/blob.bin"

    def vault_open() -> None:
        with vault.open(NS_BLOB, "latest", "blob.bin") as f:
            drain(f)

    def fs_read() -> None:
        with fs.open(path) as f:
            f.read()

    def fs_pieces(block: int) -> Callable[[], None]:
        def run() -> None:
            with fs.open(path, block_size=block) as f:
                drain(f)

        return run

    base = best(lambda: vault.read_range(NS_BLOB, "latest", "blob.bin", 0, size), repeat)
    rows = [
        ("VaultClient.read_range, whole file (baseline)", base),
        ("fs.cat_file, whole file", best(lambda: fs.cat_file(path), repeat)),
        ("fs.open(...).read()", best(fs_read, repeat)),
        ("VaultClient.open, 64 KiB reads (1 MiB buffer)", best(vault_open, repeat)),
    ]
    rows += [
        (f"fs.open, 64 KiB reads, {b >> 20} MiB block", best(fs_pieces(b), repeat)) for b in BLOCKS
    ]
    print(f"byte reads of a {size / MB:.0f} MB random file")
    print_rows(rows, size, base, "of read_range")


def random_reads(vault: VaultClient, fs: Any, size: int, count: int, seed: int) -> None:
    rng = random.Random(seed)
    offsets = [rng.randrange(size - 4096) for _ in range(count)]
    started = time.perf_counter()
    for off in offsets:
        vault.read_range(NS_BLOB, "latest", "blob.bin", off, 4096)
    base = (time.perf_counter() - started) / count
    print(f"4 KiB reads at {count} random offsets, ms each")
    print_latency("VaultClient.read_range, 4 KiB (baseline)", base, base)
    for block in BLOCKS:
        with fs.open(f"{NS_BLOB}/latest/blob.bin", block_size=block) as f:
            started = time.perf_counter()
            for off in offsets:
                f.seek(off)
                f.read(4096)
            each = (time.perf_counter() - started) / count
        print_latency(f"fs.open, {block >> 20} MiB block", each, base)


def torch_loads(vault: VaultClient, fs: Any, pt: bytes, repeat: int) -> None:
    path = f"{NS_BLOB}/latest/model.pt"

    def vault_open() -> None:
        with vault.open(NS_BLOB, "latest", "model.pt") as f:
            torch.load(f, weights_only=True)

    def fs_open(block: int) -> Callable[[], None]:
        def run() -> None:
            with fs.open(path, block_size=block) as f:
                torch.load(f, weights_only=True)

        return run

    def fs_read_all() -> None:
        with fs.open(path) as f:
            torch.load(io.BytesIO(f.read()), weights_only=True)

    base = best(vault_open, repeat)
    rows = [
        ("torch.load(VaultClient.open(...)) (baseline)", base),
        (
            "torch.load(io.BytesIO(bytes)), in memory",
            best(lambda: torch.load(io.BytesIO(pt), weights_only=True), repeat),
        ),
    ]
    rows += [
        (f"torch.load(fs.open), {b >> 20} MiB block", best(fs_open(b), repeat)) for b in BLOCKS
    ]
    rows.append(("torch.load(io.BytesIO(fs.open(...).read()))", best(fs_read_all, repeat)))
    print(f"torch.load of a {len(pt) / MB:.0f} MB state_dict ({TENSORS} tensors), weights_only")
    print_rows(rows, len(pt), base, "of VaultClient.open")


def small_file(vault: VaultClient, fs: Any, count: int) -> None:
    path = f"{NS_SMALL}/latest/state.json"
    fs.cat_file(path)  # warm: the namespace list is fetched once per filesystem
    vault.read_range(NS_SMALL, "latest", "state.json", 0, len(SMALL))
    started = time.perf_counter()
    for _ in range(count):
        vault.read_range(NS_SMALL, "latest", "state.json", 0, len(SMALL))
    base = (time.perf_counter() - started) / count
    started = time.perf_counter()
    for _ in range(count):
        fs.cat_file(path)
    cat = (time.perf_counter() - started) / count
    print(f"a {len(SMALL)}-byte file, mean of {count} reads")
    print_latency("VaultClient.read_range (baseline)", base, base)
    print_latency("fs.cat_file (resolves the ref, then reads)", cat, base)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="256MiB", help="random file for the byte reads")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    parser.add_argument("--random-reads", type=int, default=50, help="4 KiB reads per block")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    size = parse_size(args.size)
    blob = random_bytes(size, args.seed)
    pt = state_dict_bytes(args.seed)
    root = Path(tempfile.mkdtemp(prefix="ckpt-bench-fsspec-"))
    server = ServerProcess(root / "data", free_port(), root / "server.log")
    fs: Any = None
    try:
        server.start()
        with VaultClient(server.url, server.token, progress=False) as vault:
            vault.save(NS_BLOB, {"blob.bin": blob, "model.pt": pt})
            vault.save(NS_SMALL, {"state.json": SMALL})
            fs = fsspec.filesystem(
                "vault", endpoint_url=server.url, token=server.token, skip_instance_cache=True
            )
            byte_reads(vault, fs, size, args.repeat)
            random_reads(vault, fs, size, args.random_reads, args.seed)
            torch_loads(vault, fs, pt, args.repeat)
            small_file(vault, fs, SMALL_READS)
    finally:
        if fs is not None:
            fs.close()
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
