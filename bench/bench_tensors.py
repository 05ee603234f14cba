"""Tensor checkpoint series through the vault beside borg 1.2: stored ratio, restore, ingest.

Run by hand, never by the test suite. Needs torch, safetensors, numpy (bench/series.py) and
borg 1.2 on PATH (`apt-get install -y borgbackup`):

    python bench/bench_tensors.py                              # finetune, embedding, lora, bf16
    python bench/bench_tensors.py --series bf16,embedding --count 3 --json

Why: the baseline for the issue "Tensor-aware storage: byte-grouped compression and deltas
against the parent". It records what the vault stores and how fast it restores today,
beside a mature deduplicating store on the same files in the same run, so the issue's
before/after table has a "before" and a yardstick.

Per series, in one temp dir (`--tmpdir`, removed unless `--keep`):

1. generates the series with bench/series.py in a child process;
2. baseline: copies every checkpoint file with 8 MiB writes + fsync, timed;
3. vault: saves every checkpoint with `VaultClient.save` (parent = the previous one,
   chunking "large") into a fresh `ckpt serve` on loopback; stored ratio = logical bytes /
   growth of `stored_bytes` from GET /v1/stats (what is at rest, after zstd), and beside it
   logical bytes / growth of the data dir's allocated bytes (st_blocks x 512 summed: what
   `du` shows, LMDB's free pages and the journal included); ingest MB/s
   and its ratio to the local write + fsync; restores the newest and the oldest checkpoint
   with `VaultClient.load` into empty dirs, timed, compared byte for byte;
4. compaction (`after_compaction`): runs `ckpt compact --namespace NS --json` and repeats
   the stored ratio and the two restores, filling the "after" column, with what compaction
   cost in CPU seconds per GB of logical bytes;
5. borg: `borg init --encryption=none`, one `borg create --compression zstd,3` archive per
   checkpoint (timed, for its own ingest ratio), stored size = `unique_csize` from
   `borg info --json` (the deduplicated, compressed size), `borg extract` of the newest and
   the oldest archive, timed, compared byte for byte.

MB = 10^6 bytes. The machine is a shared 2-core box; client, server and borg take turns on
it, so compare within a run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench_client import (
    BenchError,
    Checkpoint,
    _copy_fsync,
    generate,
    make_client,
    same_files,
    wait_healthy,
)
from bench_ingest import Server, mb_per_s, table

MB = 1_000_000
ALL_SERIES = ("finetune", "embedding", "lora", "bf16")
BORG_TIMEOUT_S = 1800.0


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def ratio(a: float, b: float) -> float | None:
    return a / b if b else None


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


@dataclass(frozen=True)
class Before:
    """The server's figures when a series started: `stored_bytes` and the data dir's du."""

    stored: int
    disk: int
    data_dir: Path


@dataclass
class Store:
    """One store's figures for one series (vault, vault after compaction, or borg)."""

    stored_bytes: int = 0
    ratio: float | None = None
    disk_bytes: int = 0  # growth of the data dir's allocated bytes (du)
    disk_ratio: float | None = None
    ingest_s: float = 0.0
    ingest_mb_s: float = 0.0
    ingest_vs_write: float | None = None
    restore_newest_mb_s: float = 0.0
    restore_oldest_mb_s: float = 0.0
    identical: bool = False
    note: str = ""


@dataclass
class SeriesResult:
    name: str
    checkpoints: int = 0
    logical_bytes: int = 0
    newest_bytes: int = 0
    oldest_bytes: int = 0
    generate_s: float = 0.0
    write_mb_s: float = 0.0
    vault: Store = field(default_factory=Store)
    compacted: Store | None = None
    compaction: str = ""
    borg: Store = field(default_factory=Store)


# -- baseline ------------------------------------------------------------------------------


def local_write(ckpts: list[Checkpoint], work: Path) -> float:
    """Seconds to copy every checkpoint file with 8 MiB writes + fsync."""
    start = time.perf_counter()
    for ck in ckpts:
        target = work / f"ckpt-{ck.index:03d}"
        target.mkdir(parents=True, exist_ok=True)
        for fname, src in ck.paths.items():
            _copy_fsync(src, target / fname)
    seconds = time.perf_counter() - start
    shutil.rmtree(work, ignore_errors=True)
    return seconds


# -- the vault -----------------------------------------------------------------------------


def vault_restore(client: Any, namespace: str, ck: Checkpoint, ref: str, dest: Path) -> float:
    """MB/s of one `VaultClient.load` into an empty dir; BenchError when it differs."""
    start = time.perf_counter()
    client.load(namespace, ref=ref, dest=dest)
    seconds = time.perf_counter() - start
    ok = same_files(ck, dest)
    shutil.rmtree(dest, ignore_errors=True)
    if not ok:
        raise BenchError(f"{namespace}: restored checkpoint {ck.index} differs")
    return mb_per_s(ck.size, seconds)


def run_vault(
    res: SeriesResult, ckpts: list[Checkpoint], client: Any, work: Path, before: Before
) -> tuple[str, list[str]]:
    namespace = f"bench/{res.name}"
    ids: list[str] = []
    log(f"{res.name}: vault ingest of {len(ckpts)} checkpoints")
    start = time.perf_counter()
    for ck in ckpts:
        saved = client.save(
            namespace, ck.payload(), parent=ids[-1] if ids else None, chunking="large"
        )
        ids.append(saved.id)
    v = res.vault
    v.ingest_s = time.perf_counter() - start
    v.ingest_mb_s = mb_per_s(res.logical_bytes, v.ingest_s)
    v.ingest_vs_write = ratio(v.ingest_mb_s, res.write_mb_s)
    measure_vault_at_rest(v, res, ckpts, client, namespace, ids, before, work)
    return namespace, ids


def measure_vault_at_rest(
    v: Store,
    res: SeriesResult,
    ckpts: list[Checkpoint],
    client: Any,
    namespace: str,
    ids: list[str],
    before: Before,
    work: Path,
) -> None:
    """Stored ratio (the engine's and the disk's) and the two timed restores; used before
    and after compaction."""
    v.stored_bytes = client.stats().stored_bytes - before.stored
    v.ratio = ratio(res.logical_bytes, v.stored_bytes)
    v.disk_bytes = allocated(before.data_dir) - before.disk
    v.disk_ratio = ratio(res.logical_bytes, v.disk_bytes)
    log(f"{res.name}: vault restores")
    v.restore_newest_mb_s = vault_restore(client, namespace, ckpts[-1], ids[-1], work / "new")
    v.restore_oldest_mb_s = vault_restore(client, namespace, ckpts[0], ids[0], work / "old")
    v.identical = True


# -- HOOK: after compaction ----------------------------------------------------------------


def compaction_available() -> bool:
    """True when `ckpt compact --help` succeeds (the command does not exist yet)."""
    cmd = [sys.executable, "-m", "checkpoint_vault.cli", "compact", "--help"]
    done = subprocess.run(cmd, capture_output=True, check=False, timeout=60)
    return done.returncode == 0


def after_compaction(
    res: SeriesResult,
    ckpts: list[Checkpoint],
    client: Any,
    server: Server,
    ids: list[str],
    before: Before,
    work: Path,
) -> None:
    """The issue's "after" column: run `ckpt compact` on the series' namespace, then repeat
    the stored ratio and the restores into `res.compacted`."""
    if not compaction_available():
        res.compaction = "compaction: not available"
        print(res.compaction, flush=True)
        return
    namespace = f"bench/{res.name}"
    cmd = [
        sys.executable,
        "-m",
        "checkpoint_vault.cli",
        "--url",
        server.url,
        "--token",
        server.token(),
    ]
    cmd += ["compact", "--namespace", namespace, "--json"]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=3600)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        res.compaction = f"compaction: failed ({done.returncode}): {done.stderr.strip()[-300:]}"
        print(res.compaction, flush=True)
        return
    report = json.loads(done.stdout)
    cpu_per_gb = report["cpu_seconds"] / (res.logical_bytes / 1e9)
    res.compaction = (
        f"compaction: {seconds:.1f} s, {report['chunks_recoded']} chunks "
        f"({report['deltas']} deltas, {report['grouped']} grouped), "
        f"{cpu_per_gb:.1f} CPU s per logical GB"
    )
    res.compacted = Store(note=res.compaction)
    measure_vault_at_rest(res.compacted, res, ckpts, client, namespace, ids, before, work)


# -- borg ----------------------------------------------------------------------------------


def borg(env: dict[str, str], *args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(
        ["borg", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=BORG_TIMEOUT_S,
    )
    if done.returncode not in (0, 1):  # 1 is "warning" in borg 1.2
        raise BenchError(f"borg {' '.join(args)}: exit {done.returncode}: {done.stderr[-500:]}")
    return done.stdout


def borg_env(tmp: Path) -> dict[str, str]:
    """borg's cache, config and keys under the temp dir, no prompts."""
    env = dict(os.environ)
    env.update(
        BORG_BASE_DIR=str(tmp / "borg-home"),
        BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK="yes",
        BORG_RELOCATED_REPO_ACCESS_IS_OK="yes",
        BORG_PASSPHRASE="",
    )
    return env


def borg_restore(env: dict[str, str], repo: Path, ck: Checkpoint, dest: Path) -> float:
    dest.mkdir(parents=True)
    start = time.perf_counter()
    borg(env, "extract", f"{repo}::ckpt-{ck.index:03d}", cwd=dest)
    seconds = time.perf_counter() - start
    ok = same_files(ck, dest)
    shutil.rmtree(dest, ignore_errors=True)
    if not ok:
        raise BenchError(f"borg: restored checkpoint {ck.index} differs")
    return mb_per_s(ck.size, seconds)


def run_borg(res: SeriesResult, ckpts: list[Checkpoint], tmp: Path) -> None:
    env = borg_env(tmp)
    repo = tmp / "borg" / res.name
    repo.parent.mkdir(parents=True, exist_ok=True)
    borg(env, "init", "--encryption=none", str(repo))
    log(f"{res.name}: borg create of {len(ckpts)} archives")
    b = res.borg
    start = time.perf_counter()
    for ck in ckpts:
        src = next(iter(ck.paths.values())).parent
        names = sorted(ck.paths)
        borg(
            env,
            "create",
            "--compression",
            "zstd,3",
            f"{repo}::ckpt-{ck.index:03d}",
            *names,
            cwd=src,
        )
    b.ingest_s = time.perf_counter() - start
    b.ingest_mb_s = mb_per_s(res.logical_bytes, b.ingest_s)
    b.ingest_vs_write = ratio(b.ingest_mb_s, res.write_mb_s)
    info = json.loads(borg(env, "info", "--json", str(repo)))
    b.stored_bytes = int(info["cache"]["stats"]["unique_csize"])
    b.ratio = ratio(res.logical_bytes, b.stored_bytes)
    log(f"{res.name}: borg extracts")
    b.restore_newest_mb_s = borg_restore(env, repo, ckpts[-1], tmp / "borg-restore" / "new")
    b.restore_oldest_mb_s = borg_restore(env, repo, ckpts[0], tmp / "borg-restore" / "old")
    b.identical = True
    shutil.rmtree(repo, ignore_errors=True)


# -- one series ----------------------------------------------------------------------------


@dataclass
class Context:
    client: Any
    server: Server
    tmp: Path
    seed: int
    count: int | None
    keep: bool


def run_series(name: str, ctx: Context, results: list[SeriesResult]) -> None:
    res = SeriesResult(name)
    results.append(res)
    gen_dir = ctx.tmp / "series" / name
    ckpts, res.generate_s = generate(name, gen_dir, ctx.seed, ctx.count)
    res.checkpoints = len(ckpts)
    res.logical_bytes = sum(ck.size for ck in ckpts)
    res.newest_bytes, res.oldest_bytes = ckpts[-1].size, ckpts[0].size
    log(f"{name}: {res.checkpoints} checkpoints, {res.logical_bytes / MB:.1f} MB")
    res.write_mb_s = mb_per_s(res.logical_bytes, local_write(ckpts, ctx.tmp / "baseline"))
    data_dir = ctx.server.data_dir
    before = Before(ctx.client.stats().stored_bytes, allocated(data_dir), data_dir)
    work = ctx.tmp / "restore" / name
    _, ids = run_vault(res, ckpts, ctx.client, work, before)
    after_compaction(res, ckpts, ctx.client, ctx.server, ids, before, work)
    run_borg(res, ckpts, ctx.tmp)
    if not ctx.keep:
        shutil.rmtree(gen_dir, ignore_errors=True)


# -- output --------------------------------------------------------------------------------


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _mbs(s: Store) -> str:
    return f"{s.restore_newest_mb_s:.0f} / {s.restore_oldest_mb_s:.0f}"


def series_table(r: SeriesResult) -> str:
    rows: list[tuple[str, ...]] = []
    stores = [("vault", r.vault), ("vault compacted", r.compacted), ("borg 1.2", r.borg)]
    for label, s in stores:
        if s is None:
            rows.append((label, "-", "-", "-", "-", "-", r.compaction or "not run"))
            continue
        rows.append(
            (
                label,
                f"{s.stored_bytes / MB:.1f}",
                _x(s.ratio),
                "-" if s is r.borg else f"{s.disk_bytes / MB:.1f} = {_x(s.disk_ratio)}",
                _mbs(s),
                f"{s.ingest_mb_s:.0f} = {_x(s.ingest_vs_write)}" if s.ingest_s else "-",
                "yes" if s.identical else "NO",
            )
        )
    title = (
        f"{r.name}: {r.checkpoints} checkpoints, {r.logical_bytes / MB:.1f} MB logical "
        f"(newest {r.newest_bytes / MB:.1f} MB, oldest {r.oldest_bytes / MB:.1f} MB), "
        f"generated in {r.generate_s:.0f} s; local write + fsync {r.write_mb_s:.0f} MB/s"
    )
    header = (
        "store",
        "stored MB",
        "ratio",
        "du MB = ratio",
        "restore newest / oldest MB/s",
        "ingest MB/s = x local write",
        "identical",
    )
    return table(title, header, rows)


def summary_table(results: list[SeriesResult]) -> str:
    rows: list[tuple[str, ...]] = [
        (
            r.name,
            f"{r.logical_bytes / MB:.1f}",
            _x(r.vault.ratio),
            _x(r.vault.disk_ratio),
            _x(r.compacted.disk_ratio if r.compacted else None),
            _x(r.borg.ratio),
            _mbs(r.vault),
            _mbs(r.borg),
            f"{_x(r.vault.ingest_vs_write)} (borg {_x(r.borg.ingest_vs_write)})",
        )
        for r in results
    ]
    header = (
        "series",
        "logical MB",
        "vault ratio",
        "vault du ratio",
        "compacted du ratio",
        "borg ratio",
        "vault restore newest / oldest MB/s",
        "borg restore newest / oldest",
        "ingest ratio",
    )
    return table(
        "Summary (ratio = logical / stored; du ratio = logical / growth of the data dir's "
        "allocated bytes; ingest ratio = vs local write + fsync)",
        header,
        rows,
    )


# -- the run -------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> tuple[list[SeriesResult], str | None, int | None]:
    tmp = Path(tempfile.mkdtemp(prefix="ckpt-bench-tensors-", dir=args.tmpdir))
    log(f"temp dir {tmp}")
    results: list[SeriesResult] = []
    error = None
    server = Server(data_dir=tmp / "vault", log_path=tmp / "server.log")
    exit_code = None
    try:
        server.start()
        try:
            wait_healthy(server)
            client = make_client("vault", server.url, server.token())
            try:
                ctx = Context(client, server, tmp, args.seed, args.count, args.keep)
                for name in args.series:
                    run_series(name, ctx, results)
                    server.check_alive()
            finally:
                client.close()
        except Exception as e:  # report what was measured before the failure
            error = f"{type(e).__name__}: {e}"
            log(traceback.format_exc().rstrip())
            log(f"server log tail:\n{server.log_tail()}")
        finally:
            exit_code, _, _ = server.stop()
    finally:
        if args.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return results, error, exit_code


def parse_series(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [n for n in names if n not in ALL_SERIES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {','.join(ALL_SERIES)}")
    return list(dict.fromkeys(names))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_tensors.py", description=__doc__.splitlines()[0])
    p.add_argument("--series", type=parse_series, default=list(ALL_SERIES))
    p.add_argument("--seed", type=int, default=0, help="series seed (default 0)")
    p.add_argument("--count", type=int, default=None, help="checkpoints per series")
    p.add_argument("--json", action="store_true", help="also print all figures as one JSON object")
    p.add_argument("--keep", action="store_true", help="keep the temp dir")
    p.add_argument("--tmpdir", type=Path, default=None, help="where to create the temp dir")
    args = p.parse_args(argv)
    if args.count is not None and args.count < 2:
        p.error("--count must be at least 2 (newest and oldest)")
    if shutil.which("borg") is None:
        p.error("borg not found: apt-get install -y borgbackup")
    results, error, exit_code = run(args)
    print("\n\n".join([*(series_table(r) for r in results), summary_table(results)]))
    print(f"server exit code {exit_code}; MB = 10^6 bytes; shared 2-core machine")
    if error:
        print(f"ERROR: {error}")
    if args.json:
        out = {"series": [asdict(r) for r in results], "error": error, "server_exit": exit_code}
        print(json.dumps(out, sort_keys=True))
    ok = (
        error is None
        and exit_code == 0
        and all(r.vault.identical and r.borg.identical for r in results)
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
