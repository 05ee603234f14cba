"""Restores against a copy of the same files: the figures of issue 45, in one run.

Run by hand, never by the test suite (needs torch for the checkpoints, as
bench/bench_disk_speed.py does):

    python bench/bench_restore.py                  # novel ~1 GiB + finetune series of 4
    python bench/bench_restore.py --size 512MiB --count 0

What it does, in one temp dir: writes the novel checkpoint and the `finetune` series
(bench_disk_speed.prepare), starts `python -m cli serve`, saves both (handed over by
descriptor), compacts (so the older fine-tune checkpoints are deltas), then three rounds,
each timing, one after the other:

- `shutil.copyfile` of the files into new files + fsync of each (the kernel's copy: what
  `cp` does), the baseline of a local restore;
- the same files copied in 8 MiB reads and writes + fsync into new files (a userspace copy
  loop), the baseline of a restore over HTTP;
- `VaultClient.load` of the set's last checkpoint by a client on this machine (the server
  writes the files: vault/deliver.py);
- the same with `local_files=False` (the bytes come over HTTP).

Each figure is the median of the three rounds; ratios are of the medians (baseline seconds
over restore seconds: above 1.0 the restore is faster). Every restored file is compared
with its original. MB/s use MB = 10^6 bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench_disk_speed import (
    HTTP_ONLY_ENV,
    MB,
    _restored,
    _wait_healthy,
    cache_bytecode,
    child,
    copy_fsync,
    prepare,
)
from bench_ingest import Server, log, parse_size, table

ROUNDS = 3


def copyfile_fsync(src: Path, dst: Path) -> float:
    """Seconds of `shutil.copyfile` (the kernel's copy_file_range) and an fsync."""
    start = time.perf_counter()
    shutil.copyfile(src, dst)
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start


def compact(server: Server) -> None:
    req = urllib.request.Request(
        f"{server.url}/v1/admin/compact",
        method="POST",
        headers={"Authorization": f"Bearer {server.token()}"},
    )
    with urllib.request.urlopen(req, timeout=600) as resp:
        resp.read()


def measure(tmp: Path, server: Server, name: str, sets: list[dict[str, str]]) -> dict[str, Any]:
    log(f"{name}: saving {len(sets)} checkpoint(s)")
    saved = child(["save", server.url, name, json.dumps(sets)])
    compact(server)
    last, files = saved["ids"][-1], sets[-1]
    paths = [Path(p) for p in files.values()]
    nbytes = sum(p.stat().st_size for p in paths)
    times: dict[str, list[float]] = {"copyfile": [], "copy loop": [], "local": [], "http": []}
    identical = True
    copies = tmp / "copies"
    for r in range(ROUNDS):
        log(f"{name}: round {r + 1}/{ROUNDS}")
        copies.mkdir()
        times["copyfile"].append(sum(copyfile_fsync(p, copies / f"k-{p.name}") for p in paths))
        times["copy loop"].append(sum(copy_fsync(p, copies / f"u-{p.name}") for p in paths))
        shutil.rmtree(copies)
        for how in ("local", "http"):
            dest = tmp / "restore" / name
            os.environ.pop(HTTP_ONLY_ENV, None)
            if how == "http":
                os.environ[HTTP_ONLY_ENV] = "1"
            loaded = child(
                ["load", server.url, name, json.dumps([{"ref": last, "dest": str(dest)}])]
            )
            os.environ.pop(HTTP_ONLY_ENV, None)
            times[how].append(loaded["seconds"])
            identical = identical and _restored([files], [dest])
            shutil.rmtree(tmp / "restore")
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "set": name,
        "nbytes": nbytes,
        "seconds": times,
        "median_mbs": {k: nbytes / v / MB for k, v in med.items()},
        "local_vs_copyfile": med["copyfile"] / med["local"],
        "local_vs_copyfile_every_run": [
            c / h for c, h in zip(times["copyfile"], times["local"], strict=True)
        ],
        "http_vs_copy_loop": med["copy loop"] / med["http"],
        "http_vs_copy_loop_every_run": [
            c / h for c, h in zip(times["copy loop"], times["http"], strict=True)
        ],
        "identical": identical,
    }


def report(results: list[dict[str, Any]]) -> str:
    rows: list[tuple[str, ...]] = []
    for f in results:
        m = f["median_mbs"]
        rows.append(
            (
                f"{f['set']} ({f['nbytes'] / MB:.0f} MB, last checkpoint)",
                f"{m['copyfile']:.0f}",
                f"{m['local']:.0f} ({f['local_vs_copyfile']:.2f}x; every run "
                + " ".join(f"{x:.2f}" for x in f["local_vs_copyfile_every_run"])
                + ")",
                f"{m['copy loop']:.0f}",
                f"{m['http']:.0f} ({f['http_vs_copy_loop']:.2f}x; every run "
                + " ".join(f"{x:.2f}" for x in f["http_vs_copy_loop_every_run"])
                + ")",
                "yes" if f["identical"] else "NO",
            )
        )
    return table(
        f"Restores against copies into new files + fsync, MB/s, medians of {ROUNDS}",
        ("set", "copyfile", "load, local", "8 MiB copy loop", "load, HTTP", "identical"),
        rows,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=parse_size, default=parse_size("1GiB"))
    p.add_argument("--count", type=int, default=4, help="finetune checkpoints (0: none)")
    p.add_argument("--tmp", default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    cache_bytecode()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-restore-", dir=args.tmp) as t:
        tmp = Path(t)
        sets = prepare(tmp, args)
        server = Server(tmp / "data", tmp / "server.log")
        server.start()
        try:
            deadline = time.monotonic() + 60
            while not (tmp / "data" / "admin.token").exists() and time.monotonic() < deadline:
                server.check_alive()
                time.sleep(0.05)
            os.environ["CKPT_TOKEN"] = server.token()
            _wait_healthy(server)
            for name, files in sets:
                results.append(measure(tmp, server, name, files))
        finally:
            server.stop()
    print(report(results))
    if args.json:
        print(json.dumps(results))
    return 0 if all(r["identical"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
