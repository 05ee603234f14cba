"""What the data dir takes on disk (`du`), before and after the hot store shrinks (issue 32).

Run by hand, never by the test suite. Needs torch (bench/series.py):

    python bench/bench_du.py                          # finetune and embedding, both modes
    python bench/bench_du.py --series embedding --count 4 --json

Why: users judge a store by `du`, and LMDB never gives a page back to the file system, so
the engine's `stored_bytes` and the disk disagreed. This saves each series the way issue
32 describes, into a fresh `ckpt serve` per series and mode, and measures both figures:

- `finetune`: bench/series.py's full fine-tune (a ~20M-parameter transformer, AdamW),
  each checkpoint reduced to `model.pt`, a `torch.save` of the model's weights (~82 MB);
  8 checkpoints. `embedding`: the series' 400,000 x 64 fp32 table, 2% of its rows updated
  per checkpoint, `table.pt` (~102 MB); 10 checkpoints.
- modes: `before` runs the server with `[storage] shrink_above = 1000` (never shrinks: the
  behaviour before issue 32), `after` with the default (0.05); both compact after every
  save. `final` (default shrink_above) compacts once, after the last save: the ratio the
  schedule's order is held to, and the CPU it costs.
- each checkpoint is saved with `VaultClient.save` (parent: the previous one, chunking
  "large"), then `compact` of the namespace runs (what the schedule does to checkpoints
  saved less often than it runs; not in `final` mode); after each step the data dir's
  allocated bytes (st_blocks x 512 summed: what `du` shows) and `stored_bytes` are read.
- then the newest checkpoint is restored five times (timed, compared byte for byte; the
  median reported, all five in the JSON), every other one deleted, one `gc` that deletes
  something (before it, runs that find the uploads' reservations still in force,
  `[uploads] ttl = "2s"`) and one `compact` run, and the data dir is measured against the
  newest checkpoint's size.
- the server's peak RSS: VmHWM from /proc of the process that writes (and compacts) once
  the series is saved and compacted, the peak of its RssAnon sampled every 50 ms
  (bench_ingest.RssSampler), and the highest VmHWM of its worker processes.
- the alternative measured beside the shrink, on the `before` server's data dir once it
  stopped, at the end of its series (before the deletes): a compacting copy of the frames
  environment (`mdb_env_copy2(MDB_CP_COMPACT)`, py-lmdb `Environment.copy(compact=True)`),
  timed, with the bytes it wrote; then the shrink itself on the same dir (`Vault.shrink`
  opened offline), timed, with what the frames file takes after it.

MB = 10^6 bytes, MiB = 2^20. The machine is a shared 2-core box: compare within a run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench_client import Checkpoint, generate, make_client, wait_healthy
from bench_ingest import KiB, RssSampler, Server, proc_status_kib, table
from bench_tensors import vault_restore

MB = 1_000_000
MiB = 1 << 20
ALL_SERIES = ("finetune", "embedding")
# [storage] shrink_above (1000: never); `final` compacts once, after the last save
MODES = {"before": 1000.0, "after": 0.05, "final": 0.05}
RESTORES = 5  # restores of the newest per mode, the median reported (the machine is shared)
GC_ATTEMPTS = 60  # gc runs while the uploads' 2 s reservations lapse


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def allocated(root: Path) -> int:
    """Bytes the files under `root` take on disk (st_blocks x 512), as `du` counts."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                continue
    return total


def children(pid: int) -> list[int]:
    """The child processes of `pid` (the workers of `ckpt serve --workers`)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(c) for c in text.split()]


@dataclass
class Step:
    """The data dir after one save and its compaction."""

    logical: int  # the series' bytes saved so far
    du: int
    stored: int


@dataclass
class ModeResult:
    mode: str
    shrink_above: float
    steps: list[Step] = field(default_factory=list)
    du_ratio: float = 0.0  # logical / du, at the end of the series
    stored_ratio: float = 0.0  # logical / stored_bytes (the engine's figure)
    compact_cpu_s: float = 0.0  # compaction's CPU seconds, summed over the runs
    restore_newest_mb_s: float = 0.0  # the median of RESTORES
    restores_mb_s: list[float] = field(default_factory=list)
    only_newest_du: int = 0  # after deleting all but the newest, gc and compact
    only_newest_ratio: float = 0.0  # that over the newest checkpoint's size
    vm_hwm_mib: float = 0.0  # the process that writes (and compacts)
    rss_anon_peak_mib: float = 0.0
    workers_vm_hwm_mib: float = 0.0  # the highest of its worker processes' (if any)
    shrinks: list[str] = field(default_factory=list)  # the server's shrink log lines


@dataclass
class Alternative:
    """The `before` data dir at the end of its series: a compacting copy against a shrink."""

    frames_du: int = 0
    copy_s: float = 0.0
    copy_bytes: int = 0
    shrink_s: float = 0.0
    frames_du_after_shrink: int = 0


@dataclass
class SeriesResult:
    name: str
    checkpoints: int = 0
    logical: int = 0
    newest: int = 0
    modes: dict[str, ModeResult] = field(default_factory=dict)
    alternative: Alternative | None = None


# -- the series ----------------------------------------------------------------------------


def model_only(ckpts: list[Checkpoint]) -> list[Checkpoint]:
    """The fine-tune series as issue 32 saved it: `torch.save` of the weights alone."""
    import torch

    out = []
    for ck in ckpts:
        train = ck.paths["train.pt"]
        target = train.with_name("model.pt")
        torch.save(torch.load(train, weights_only=True)["model"], target)
        for path in ck.paths.values():
            path.unlink()
        out.append(Checkpoint(ck.index, {"model.pt": target}))
    return out


def series(name: str, out: Path, seed: int, count: int | None) -> list[Checkpoint]:
    ckpts, seconds = generate(name, out, seed, count)
    log(f"{name}: generated in {seconds:.0f} s")
    return model_only(ckpts) if name == "finetune" else ckpts


# -- one server, one mode ------------------------------------------------------------------


@dataclass
class ConfiguredServer(Server):
    """bench_ingest's `ckpt serve` on loopback, with a config file."""

    config: Path | None = None

    def start(self) -> None:
        log(f"starting server on {self.data_dir} with {self.config}")
        self._log = self.log_path.open("ab")
        cmd = [sys.executable, "-m", "checkpoint_vault.cli", "serve", "--data", str(self.data_dir)]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port), "--config", str(self.config)]
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.log_path.parent
        )


def start_server(tmp: Path, mode: str, shrink_above: float) -> ConfiguredServer:
    """A fresh server whose GC takes what is unreferenced at once (uploads' reservations
    lapse after 2 s) and whose schedule runs nothing on its own."""
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / f"{mode}.toml"
    config.write_text(
        f'[storage]\nshrink_above = {shrink_above}\n[gc]\ngrace = "0s"\n[uploads]\nttl = "2s"\n'
        '[maintenance]\ncompact_interval = "0s"\ngc_interval = "0s"\nscrub_interval = "0s"\n'
        'retention_interval = "0s"\nsample_interval = "0s"\n'
    )
    server = ConfiguredServer(
        data_dir=tmp / f"data-{mode}", log_path=tmp / f"server-{mode}.log", config=config
    )
    server.start()
    wait_healthy(server)
    return server


def run_mode(res: SeriesResult, ckpts: list[Checkpoint], tmp: Path, mode: str) -> None:
    """Save, compact after each save, measure; then keep only the newest. In `before` mode
    the alternatives are measured on the data dir at the end of the series, the server
    stopped meanwhile."""
    m = ModeResult(mode, MODES[mode])
    res.modes[mode] = m
    server = start_server(tmp, mode, m.shrink_above)
    data = server.data_dir
    ns = f"du/{res.name}"
    try:
        client = make_client("vault", server.url, server.token())
        try:
            with RssSampler({"server": server.pid}) as rss:
                ids = save_and_compact(m, ckpts, client, ns, data)
                m.vm_hwm_mib = proc_status_kib(server.pid).get("VmHWM", 0) / KiB
                m.workers_vm_hwm_mib = max(
                    (proc_status_kib(w).get("VmHWM", 0) / KiB for w in children(server.pid)),
                    default=0.0,
                )
                m.rss_anon_peak_mib = rss.peak("server").rss_anon_mib or 0.0
            m.du_ratio = res.logical / m.steps[-1].du
            m.stored_ratio = res.logical / m.steps[-1].stored
            m.restores_mb_s = [
                vault_restore(client, ns, ckpts[-1], ids[-1], tmp / "restore")
                for _ in range(RESTORES)
            ]
            m.restore_newest_mb_s = statistics.median(m.restores_mb_s)
        finally:
            client.close()
        if mode == "before":
            server.stop()
            res.alternative = measure_alternative(data, tmp / "alternative")
            server.start()
            wait_healthy(server)
        client = make_client("vault", server.url, server.token())
        try:
            keep_only_newest(m, client, ns, ids, data, res.newest)
        finally:
            client.close()
    finally:
        server.stop()
        m.shrinks = [
            line.strip()
            for line in server.log_path.read_text(errors="replace").splitlines()
            if "shrink:" in line
        ]


def save_and_compact(
    m: ModeResult, ckpts: list[Checkpoint], client: Any, ns: str, data: Path
) -> list[str]:
    ids: list[str] = []
    logical = 0
    for ck in ckpts:
        saved = client.save(ns, ck.payload(), parent=ids[-1] if ids else None, chunking="large")
        ids.append(saved.id)
        logical += ck.size
        if m.mode != "final" or ck is ckpts[-1]:
            m.compact_cpu_s += client.compact(ns).cpu_seconds
        step = Step(logical, allocated(data), client.stats().stored_bytes)
        m.steps.append(step)
        log(
            f"{m.mode} {ns} #{ck.index}: du {step.du / MB:.1f} MB, stored "
            f"{step.stored / MB:.1f} MB, logical {logical / MB:.1f} MB"
        )
    return ids


def keep_only_newest(
    m: ModeResult, client: Any, ns: str, ids: list[str], data: Path, newest: int
) -> None:
    for old in ids[:-1]:
        client.delete(ns, old)
    for _ in range(GC_ATTEMPTS):  # the uploads' reservations lapse 2 s after they opened
        if client.gc().chunks_deleted:  # the one GC that counts (issue 32: gc, compact)
            break
        time.sleep(0.5)
    client.compact(ns)
    m.only_newest_du = allocated(data)
    m.only_newest_ratio = m.only_newest_du / newest


# -- the alternative -----------------------------------------------------------------------


def measure_alternative(data: Path, tmp: Path) -> Alternative:
    """On a stopped server's data dir: a compacting copy of the frames environment, timed
    (read only: the dir stays as it was); then the shrink, timed, on a copy of the dir (the
    vault opened offline, as `ckpt gc --data` does)."""
    import lmdb

    from checkpoint_vault.vault import Vault, VaultConfig

    alt = Alternative()
    frames = data / "vault" / "frames"
    alt.frames_du = allocated(frames)
    copy = tmp / "frames-copy"
    copy.mkdir(parents=True)
    env = lmdb.open(str(frames), readonly=True, lock=False, max_dbs=4)
    start = time.perf_counter()
    env.copy(str(copy), compact=True)
    fd = os.open(copy / "data.mdb", os.O_RDONLY)
    os.fsync(fd)  # what a swap would need before the rename
    os.close(fd)
    alt.copy_s = time.perf_counter() - start
    env.close()
    alt.copy_bytes = allocated(copy)
    shutil.rmtree(copy)
    shutil.copytree(data / "vault", tmp / "vault")
    vault = Vault(tmp / "vault", VaultConfig())
    try:
        start = time.perf_counter()
        vault.shrink(above=0.0)
        alt.shrink_s = time.perf_counter() - start
    finally:
        vault.close()
    alt.frames_du_after_shrink = allocated(tmp / "vault" / "frames")
    shutil.rmtree(tmp / "vault")
    return alt


# -- the run -------------------------------------------------------------------------------


def run_series(name: str, args: argparse.Namespace, tmp: Path) -> SeriesResult:
    res = SeriesResult(name)
    ckpts = series(name, tmp / "series" / name, args.seed, args.count)
    res.checkpoints = len(ckpts)
    res.logical = sum(ck.size for ck in ckpts)
    res.newest = ckpts[-1].size
    log(f"{name}: {res.checkpoints} checkpoints, {res.logical / MB:.1f} MB")
    for mode in MODES:
        run_mode(res, ckpts, tmp / name, mode)
    if not args.keep:
        shutil.rmtree(tmp / "series" / name, ignore_errors=True)
        shutil.rmtree(tmp / name, ignore_errors=True)
    return res


def _x(v: float) -> str:
    return f"{v:.2f}x"


def report(results: list[SeriesResult]) -> str:
    rows: list[tuple[str, ...]] = []
    for r in results:
        for m in r.modes.values():
            rows.append(
                (
                    r.name,
                    m.mode,
                    f"{r.logical / MB:.0f}",
                    f"{m.steps[-1].du / MB:.1f} = {_x(m.du_ratio)}",
                    f"{m.steps[-1].stored / MB:.1f} = {_x(m.stored_ratio)}",
                    f"{m.only_newest_du / MB:.1f} = {_x(m.only_newest_ratio)}",
                    f"{m.restore_newest_mb_s:.0f}",
                    f"{m.vm_hwm_mib:.0f} / {m.rss_anon_peak_mib:.0f} "
                    f"(workers {m.workers_vm_hwm_mib:.0f})",
                    f"{m.compact_cpu_s:.1f}",
                )
            )
    header = (
        "series",
        "mode",
        "logical MB",
        "du MB = logical/du",
        "stored MB = logical/stored",
        "only newest: du MB = du/newest",
        "restore newest MB/s",
        "server VmHWM / RssAnon peak MiB (workers' VmHWM)",
        "compaction CPU s",
    )
    title = "before/after: compaction after every save; final: once at the end; du = allocated"
    out = [table(f"{title} bytes of the data dir", header, rows)]
    alt_rows: list[tuple[str, ...]] = [
        (
            r.name,
            f"{r.alternative.frames_du / MB:.1f}",
            f"{r.alternative.copy_s:.2f} s, {r.alternative.copy_bytes / MB:.1f} MB written",
            f"{r.alternative.shrink_s:.3f} s, "
            f"frames {r.alternative.frames_du_after_shrink / MB:.1f} MB",
        )
        for r in results
        if r.alternative is not None
    ]
    out.append(
        table(
            "The frames environment at the end of a before-mode series: a compacting copy "
            "against the shrink",
            ("series", "frames du MB", "compacting copy (+ fsync)", "shrink (punch holes)"),
            alt_rows,
        )
    )
    for r in results:
        for m in r.modes.values():
            steps = ", ".join(f"{s.logical / s.du:.2f}" for s in m.steps)
            out.append(f"{r.name} {m.mode}: logical/du after each save (+ compact): {steps}")
    return "\n\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_du.py", description=__doc__.splitlines()[0])
    p.add_argument("--series", default=",".join(ALL_SERIES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--count", type=int, default=None, help="checkpoints per series")
    p.add_argument("--json", action="store_true", help="also print every figure as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temp dir")
    p.add_argument("--tmpdir", type=Path, default=None)
    args = p.parse_args(argv)
    names = [n for n in args.series.split(",") if n]
    if not names or set(names) - set(ALL_SERIES):
        p.error(f"--series: choose from {','.join(ALL_SERIES)}")
    tmp = Path(tempfile.mkdtemp(prefix="ckpt-bench-du-", dir=args.tmpdir))
    results: list[SeriesResult] = []
    error = None
    try:
        for name in names:
            results.append(run_series(name, args, tmp))
    except Exception as e:  # report what was measured before the failure
        error = f"{type(e).__name__}: {e}"
        log(traceback.format_exc().rstrip())
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(report([r for r in results if r.modes]))
    for r in results:
        for m in r.modes.values():
            for line in m.shrinks[-3:]:
                print(f"{r.name} {m.mode} server log: {line[-160:]}")
    if error:
        print(f"ERROR: {error}")
    if args.json:
        print(json.dumps({"series": [asdict(r) for r in results], "error": error}))
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main())
