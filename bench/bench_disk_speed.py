"""Saving and restoring at the speed of the local disk: the figures of issue 13, in one run.

Run by hand, never by the test suite (needs torch for the checkpoints: `pip install
torch==2.13.0 safetensors numpy`):

    python bench/bench_disk_speed.py                      # novel ~1 GB + finetune series
    python bench/bench_disk_speed.py --size 512MiB --count 4 --json

What it does, in one temp dir:

1. writes a novel checkpoint (torch.save of random fp32 tensors, ~`--size`) and the
   `finetune` series of bench/series.py (`--count` checkpoints, every weight changes every
   step), each in a child process so torch's memory counts against nobody measured here;
2. baseline, same run: copies every file in 8 MiB writes + fsync (the source is in the
   page cache, so this is what writing the same bytes to a local file costs): twice into
   new files, then once over the second copy, keeping the fastest; the same copy is the
   baseline for saves and for restores. The copy over a copy reuses the page-cache pages
   it just freed, which on this VM costs a third of the kernel time of pages new to a
   file (a fresh guest page costs the host a fault), while the vault's data file, like a
   checkpoint, only grows into new pages: the fastest new-file copy is printed too;
3. starts `python -m cli serve` on a loopback port;
4. saves: one child process per checkpoint set runs `VaultClient.save` (the series into one
   namespace, each with the previous as parent) and reports the seconds inside `save`, its
   own peak RSS and the bytes it sent: the server is on this machine, so by default the
   client hands each file over by descriptor on its local socket (client/local.py) and
   sends nearly nothing; `--http-only` makes it send them, as a client elsewhere would;
5. restores: a child process per set runs `VaultClient.load` into an empty dir (seconds
   inside `load`); then `ckpt pull` as a whole process, start to exit; every restored file
   is compared with its original; both twice, keeping the faster, like the copy (a single
   restore swung 0.5-0.9x between runs of the same code here, the first read of data gone
   cold in the page cache being ~3x slower);
6. `curl` GETs the novel file twice to /dev/null and keeps the second (hot) rate;
7. the server's peak RSS (VmHWM), and the start-up time of `python -c "import client"` and
   `ckpt --help` (best of 5, beside `python -c pass`);
8. CPU seconds per GB of the server (utime + stime from /proc/PID/stat around each save
   and the faster load) and of the client child (start to exit, imports included).

Every process it starts runs with its bytecode cached, as after `pip install` (which
compiles it) or any earlier run: where PYTHONDONTWRITEBYTECODE is set (this sandbox sets
it), it is dropped for the children and one warm-up import writes the caches; otherwise a
`ckpt pull` paid ~0.13 s compiling our modules at every start. `--cold-bytecode` keeps the
environment as it is.

MB/s figures use MB = 10^6 bytes; memory is in MiB.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench_ingest import Server, log, parse_size, proc_status_kib, table
from proc_cpu import tree_cpu

MB = 1_000_000
MiB = 1 << 20
PIECE = 8 * MiB
BENCH = Path(__file__).resolve().parent
TARGET_RATIO = 0.8
RESTORES = 2  # each restore is timed this many times, keeping the fastest
GET_TARGET_MBS = 1000.0


def make_novel(path: Path, size: int, seed: int) -> None:
    """torch.save of random fp32 tensors adding up to about `size` bytes (child process)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    state: dict[str, Any] = {}
    left, i = size, 0
    while left > 0:
        n = min(left, 64 * MiB) // 4
        state[f"layer{i}.weight"] = torch.randn(n, generator=gen)
        left -= n * 4
        i += 1
    state["step"] = 1000
    torch.save(state, path)


def copy_fsync(src: Path, dst: Path) -> float:
    """Seconds to copy `src` to `dst` in 8 MiB writes, then fsync."""
    start = time.perf_counter()
    with open(src, "rb") as f, open(dst, "wb") as out:
        while piece := f.read(PIECE):
            out.write(piece)
        out.flush()
        os.fsync(out.fileno())
    return time.perf_counter() - start


HTTP_ONLY_ENV = "BENCH_DISK_HTTP_ONLY"


def child(argv: list[str]) -> dict[str, Any]:
    """Run this script's `--child` mode in a fresh interpreter; its JSON answer."""
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", *argv],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def run_child(args: argparse.Namespace) -> dict[str, Any]:
    """The measured side: save or load checkpoint sets, timing only the client calls."""
    from checkpoint_vault.client import VaultClient

    op, url, ns, spec = args.child
    sets: list[dict[str, str]] = json.loads(spec)
    seconds, ids = 0.0, []
    local = os.environ.get(HTTP_ONLY_ENV) != "1"
    with VaultClient(url, token=os.environ["CKPT_TOKEN"], local_files=local) as c:
        parent = None
        for files in sets:
            start = time.perf_counter()
            if op == "save":
                ck = c.save(ns, files=files, parent=parent, chunking="large")
                parent = ck.id
                ids.append(ck.id)
            else:
                c.load(ns, files["ref"], dest=files["dest"])
            seconds += time.perf_counter() - start
        sent = c.transfer.bytes_sent
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "seconds": seconds,
        "ids": ids,
        "rss_mib": usage.ru_maxrss / 1024,
        "sent": sent,
        "cpu_s": usage.ru_utime + usage.ru_stime,
    }


@dataclass
class SetFigures:
    """One checkpoint set: the novel file, or the whole series."""

    name: str
    files: int
    nbytes: int
    copy_s: float = 0.0  # the fastest copy + fsync: the baseline
    copy_new_s: float = 0.0  # the fastest into new files only
    save_s: float = 0.0
    load_s: float = 0.0
    pull_s: float = 0.0
    save_server_cpu_s: float = 0.0  # the server's utime + stime during the save
    save_client_cpu_s: float = 0.0  # the saving child's, start to exit
    load_server_cpu_s: float = 0.0  # during the faster VaultClient.load
    load_client_cpu_s: float = 0.0
    save_rss_mib: float = 0.0
    save_sent: int = 0  # bytes the saving client sent: ~0 when the files were handed over
    load_rss_mib: float = 0.0
    identical: bool = False

    def ratio(self, seconds: float) -> float:
        return self.copy_s / seconds if seconds else 0.0


@dataclass
class Figures:
    sets: list[SetFigures] = field(default_factory=list)
    curl_get_mbs: float = 0.0
    curl_size: int = 0
    server_hwm_mib: float = 0.0
    python_pass_ms: float = 0.0
    import_client_ms: float = 0.0
    ckpt_help_ms: float = 0.0
    bytecode: str = "cached"


def best_of(cmd: list[str], runs: int = 5) -> float:
    """Fastest wall time of `cmd` over `runs` runs, in ms."""
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=tempfile.gettempdir())
        best = min(best, time.perf_counter() - start)
    return best * 1000


def curl_get(url: str, token: str) -> float:
    """MB/s of one `curl` GET to /dev/null."""
    out = subprocess.run(
        [
            "curl",
            "-sf",
            "-o",
            "/dev/null",
            "-H",
            f"Authorization: Bearer {token}",
            "-w",
            "%{size_download} %{time_total}",
            url,
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    size, seconds = out.stdout.split()
    return int(size) / float(seconds) / MB


def prepare(tmp: Path, args: argparse.Namespace) -> list[tuple[str, list[dict[str, str]]]]:
    """The checkpoint sets: [(name, [{file name: path}, ...])]."""
    sets: list[tuple[str, list[dict[str, str]]]] = []
    if args.size:
        novel = tmp / "novel" / "model.pt"
        novel.parent.mkdir()
        log(f"writing a novel checkpoint of ~{args.size / MB:.0f} MB")
        subprocess.run(
            [
                sys.executable,
                "-c",
                f"import sys; sys.path.insert(0, {str(BENCH)!r}); import bench_disk_speed as b; "
                f"b.make_novel(__import__('pathlib').Path({str(novel)!r}), {args.size}, 7)",
            ],
            check=True,
        )
        sets.append(("novel", [{"model.pt": str(novel)}]))
    if args.count:
        out = tmp / "finetune"
        log(f"writing the finetune series ({args.count} checkpoints)")
        subprocess.run(
            [
                sys.executable,
                str(BENCH / "series.py"),
                "finetune",
                "--out",
                str(out),
                "--count",
                str(args.count),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        ckpts = sorted(p for p in out.iterdir() if p.is_dir())
        sets.append(("finetune", [{f.name: str(f) for f in sorted(d.iterdir())} for d in ckpts]))
    # The files were just written: without this the kernel writes ~2 GB of them back while
    # the copies and the saves are timed, competing with both for the disk (the novel
    # save measured 590-670 MB/s that way, 900-960 with its source already on disk).
    os.sync()
    return sets


def measure(tmp: Path, server: Server, name: str, sets: list[dict[str, str]]) -> SetFigures:
    paths = [Path(p) for files in sets for p in files.values()]
    fig = SetFigures(name, len(paths), sum(p.stat().st_size for p in paths))
    copies = tmp / "copies"
    copies.mkdir(exist_ok=True)

    # Two copies into new files, as a checkpoint is written (and as the vault's data file
    # grows), then one over the second: that reuses the page-cache pages it just freed,
    # which on this VM costs ~0.5 s of kernel time per GB against 1.4-1.7 s for pages new
    # to a file. The baseline is the fastest of the three, the strictest; the new-file one
    # is reported beside it.
    def copy_all(n: int) -> float:
        return sum(copy_fsync(p, copies / f"{n}-{i}.bin") for i, p in enumerate(paths))

    fig.copy_new_s = min(copy_all(0), copy_all(1))
    fig.copy_s = min(fig.copy_new_s, copy_all(1))
    shutil.rmtree(copies)
    log(f"{name}: saving {fig.nbytes / MB:.0f} MB in {len(sets)} checkpoint(s)")
    before = tree_cpu(server.pid)
    saved = child(["save", server.url, name, json.dumps(sets)])
    fig.save_server_cpu_s = tree_cpu(server.pid) - before
    fig.save_s, fig.save_rss_mib, fig.save_sent = saved["seconds"], saved["rss_mib"], saved["sent"]
    fig.save_client_cpu_s = saved["cpu_s"]
    dests = [tmp / "restore" / name / ck for ck in saved["ids"]]
    loads = [{"ref": ck, "dest": str(d)} for ck, d in zip(saved["ids"], dests, strict=True)]
    fig.identical = True
    fig.load_s = fig.pull_s = float("inf")
    for attempt in range(RESTORES):  # the best of two, as for the copy
        log(f"{name}: restoring with VaultClient.load ({attempt + 1}/{RESTORES})")
        before = tree_cpu(server.pid)
        loaded = child(["load", server.url, name, json.dumps(loads)])
        if loaded["seconds"] < fig.load_s:
            fig.load_server_cpu_s = tree_cpu(server.pid) - before
            fig.load_client_cpu_s = loaded["cpu_s"]
        fig.load_s = min(fig.load_s, loaded["seconds"])
        fig.load_rss_mib = max(fig.load_rss_mib, loaded["rss_mib"])
        fig.identical = fig.identical and _restored(sets, dests)
        shutil.rmtree(tmp / "restore" / name)
        log(f"{name}: restoring with ckpt pull ({attempt + 1}/{RESTORES})")
        start = time.perf_counter()
        for ck, d in zip(saved["ids"], dests, strict=True):
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "checkpoint_vault.cli",
                    "--url",
                    server.url,
                    "pull",
                    name,
                    ck,
                    str(d),
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        fig.pull_s = min(fig.pull_s, time.perf_counter() - start)
        fig.identical = fig.identical and _restored(sets, dests)
        shutil.rmtree(tmp / "restore" / name)
    return fig


def _restored(sets: list[dict[str, str]], dests: list[Path]) -> bool:
    return all(
        filecmp.cmp(p, d / n, shallow=False)
        for files, d in zip(sets, dests, strict=True)
        for n, p in files.items()
    )


def cache_bytecode() -> None:
    """Let the processes we start write bytecode caches, and write ours once now."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    modules = "client, cli, client.sync, node.serve, vault"
    subprocess.run([sys.executable, "-c", f"import {modules}"], check=True)


def run(args: argparse.Namespace) -> Figures:
    fig = Figures()
    if args.cold_bytecode:
        fig.bytecode = "compiled at every start" if sys.dont_write_bytecode else "cached"
    else:
        cache_bytecode()
    with tempfile.TemporaryDirectory(prefix="bench-disk-", dir=args.tmp) as t:
        tmp = Path(t)
        sets = prepare(tmp, args)
        server = Server(tmp / "data", tmp / "server.log")
        server.start()
        try:
            wait = time.monotonic() + 60
            while not (tmp / "data" / "admin.token").exists() and time.monotonic() < wait:
                server.check_alive()
                time.sleep(0.05)
            os.environ["CKPT_TOKEN"] = server.token()
            _wait_healthy(server)
            for name, files in sets:
                fig.sets.append(measure(tmp, server, name, files))
            if sets and sets[0][0] == "novel":
                url = f"{server.url}/v1/namespaces/novel/checkpoints/latest/files/model.pt"
                curl_get(url, server.token())
                fig.curl_get_mbs = curl_get(url, server.token())
            fig.server_hwm_mib = proc_status_kib(server.pid).get("VmHWM", 0) / 1024
        finally:
            server.stop()
    fig.python_pass_ms = best_of([sys.executable, "-c", "pass"])
    fig.import_client_ms = best_of([sys.executable, "-c", "import client"])
    fig.ckpt_help_ms = best_of([sys.executable, "-m", "checkpoint_vault.cli", "--help"])
    return fig


def _wait_healthy(server: Server) -> None:
    import urllib.request

    deadline = time.monotonic() + 60
    while True:
        server.check_alive()
        try:
            with urllib.request.urlopen(f"{server.url}/v1/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("server not healthy after 60 s")
        time.sleep(0.1)


def gb(s: SetFigures) -> float:
    return s.nbytes / (1000 * MB)


def report(fig: Figures) -> str:
    def rate(s: SetFigures, seconds: float) -> str:
        return f"{s.nbytes / seconds / MB:.0f} MB/s ({s.ratio(seconds):.2f}x)" if seconds else "-"

    rows: list[tuple[str, ...]] = [
        (
            f"{s.name} ({s.files} files, {s.nbytes / MB:.0f} MB)",
            f"{s.nbytes / s.copy_s / MB:.0f} MB/s",
            rate(s, s.save_s),
            rate(s, s.load_s),
            rate(s, s.pull_s),
            f"{s.save_rss_mib:.0f} / {s.load_rss_mib:.0f}",
            "yes" if s.identical else "NO",
        )
        for s in fig.sets
    ]
    out = [
        table(
            f"vs copy + fsync (target >= {TARGET_RATIO}x)",
            (
                "set",
                "copy+fsync",
                "save",
                "load",
                "ckpt pull",
                "client RSS MiB save/load",
                "identical",
            ),
            rows,
        ),
        f"curl GET, hot: {fig.curl_get_mbs:.0f} MB/s (target {GET_TARGET_MBS:.0f})",
        f"server peak RSS (VmHWM): {fig.server_hwm_mib:.0f} MiB (target < 300)",
        f"python -c pass: {fig.python_pass_ms:.0f} ms; import client: "
        f"{fig.import_client_ms:.0f} ms (target < 150); ckpt --help: {fig.ckpt_help_ms:.0f} ms "
        "(target < 300)",
        f"bytecode: {fig.bytecode}",
        "copy + fsync into new files only: "
        + ", ".join(
            f"{s.name} {s.nbytes / s.copy_new_s / MB:.0f} MB/s"
            f" (save {s.copy_new_s / s.save_s:.2f}x, load {s.copy_new_s / s.load_s:.2f}x)"
            for s in fig.sets
            if s.copy_new_s and s.save_s and s.load_s
        ),
        "CPU s per GB (server / client process): "
        + ", ".join(
            f"{s.name} save {s.save_server_cpu_s / gb(s):.2f} / {s.save_client_cpu_s / gb(s):.2f},"
            f" load {s.load_server_cpu_s / gb(s):.2f} / {s.load_client_cpu_s / gb(s):.2f}"
            for s in fig.sets
        ),
        "saves: "
        + ", ".join(
            f"{s.name} {'handed over by descriptor' if s.save_sent < s.nbytes / 100 else 'sent'}"
            f" ({s.save_sent / MB:.1f} MB sent)"
            for s in fig.sets
        ),
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--size",
        type=parse_size,
        default=parse_size("1GiB"),
        help="novel checkpoint size (0: none)",
    )
    p.add_argument("--count", type=int, default=4, help="finetune checkpoints (0: none)")
    p.add_argument("--tmp", default=None, help="where the temp dir goes (default: system)")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--cold-bytecode",
        action="store_true",
        help="keep PYTHONDONTWRITEBYTECODE if set (every process compiles our modules)",
    )
    p.add_argument(
        "--http-only",
        action="store_true",
        help="send the files over HTTP, as a client on another machine must",
    )
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.http_only:
        os.environ[HTTP_ONLY_ENV] = "1"  # read by the saving child
    if args.child:
        print(json.dumps(run_child(args)))
        return 0
    fig = run(args)
    print(json.dumps(asdict(fig), indent=2) if args.json else report(fig))
    return 0 if all(s.identical for s in fig.sets) else 1


if __name__ == "__main__":
    sys.exit(main())
