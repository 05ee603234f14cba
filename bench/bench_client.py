"""Realistic checkpoint series through `VaultClient` against a real server, vs the local disk.

Run by hand, never by the test suite (needs torch, safetensors, numpy for the tensor series:
see bench/series.py):

    python bench/bench_client.py                          # all four series
    python bench/bench_client.py --series agent,lora --json
    python bench/bench_client.py --client raw             # stdlib stand-in, see below

What it does, in one temp dir:

1. starts `python -m cli serve` on a free loopback port and polls GET /v1/health;
2. per series (bench/series.py, generated in a child process so torch's memory does not
   count against the client): writes the checkpoints to disk and times that;
3. baseline, same run: copies every checkpoint file in 8 MiB writes + fsync (agent state:
   the bytes written + fsync) and reads the copies back in 8 MiB reads;
4. ingests every checkpoint with `VaultClient.save` into its own namespace, parent = the
   previous checkpoint, chunking "small" for agent state and "large" for tensors, timing
   each save;
5. restores the last `--restore-last` checkpoints with `VaultClient.load` into an empty dir
   each, and compares the restored files with the originals byte for byte (not timed);
6. reports ingest and restore MB/s against the baseline, the bytes the client sent and
   received, how much the server's `stored_bytes` grew, the per-series dedup ratio, peak
   memory of server and client, and save latency percentiles.

`--client raw` replaces VaultClient with `RawHTTPClient` below: a stand-in with the same
surface that streams whole files through `PUT /v1/uploads/{id}/files/{name}` (no
client-side chunking or dedup, so every byte crosses the wire). It exists so the harness
can run before the real client does, and as a point of comparison after.

MB/s figures use MB = 10^6 bytes; memory is in MiB.
"""

from __future__ import annotations

import argparse
import filecmp
import http.client
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote, urlsplit

import blake3
from bench_ingest import (
    KiB,
    MemoryPeak,
    RssSampler,
    Server,
    cache_residency,
    describe_cache,
    mb_per_s,
    table,
)

from checkpoint_vault.protocol import StatsReport

MB = 1_000_000
MiB = 1 << 20
PIECE = 8 * MiB
SERIES_SCRIPT = Path(__file__).with_name("series.py")
ALL_SERIES = ("lora", "finetune", "embedding", "agent")
CHUNKING = {"lora": "large", "finetune": "large", "embedding": "large", "agent": "small"}
IN_MEMORY = {"agent"}  # series whose checkpoints are handed to save() as bytes
STARTUP_TIMEOUT_S = 60.0
HEALTH_POLL_S = 0.1
GENERATE_TIMEOUT_S = 900.0
HTTP_TIMEOUT_S = 600.0


class BenchError(RuntimeError):
    """The benchmark cannot go on; the message says why."""


def log(message: str) -> None:
    """Progress goes to stderr so stdout holds only the results."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def latency_summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        "p50_ms": percentile(values, 50) * 1000,
        "p99_ms": percentile(values, 99) * 1000,
        "max_ms": max(values) * 1000,
        "mean_ms": sum(values) / len(values) * 1000,
    }


def ratio(a: float, b: float) -> float | None:
    return a / b if b else None


# -- a stand-in for VaultClient ------------------------------------------------------------


@dataclass
class Transfer:
    bytes_sent: int = 0
    bytes_received: int = 0


@dataclass
class RawCheckpoint:
    id: str
    namespace: str
    parent: str | None
    size: int
    files: dict[str, dict[str, Any]]


class RawHTTPClient:
    """VaultClient's surface (save, load, stats, transfer, close) over http.client, one
    keep-alive connection. Files go whole through PUT .../files/{name}; the server chunks
    them. Counts request and response body bytes like VaultClient.transfer."""

    def __init__(self, url: str, token: str) -> None:
        parts = urlsplit(url)
        if parts.hostname is None or parts.port is None:
            raise BenchError(f"cannot use url {url!r}")
        self._conn = http.client.HTTPConnection(
            parts.hostname, parts.port, timeout=HTTP_TIMEOUT_S, blocksize=MiB
        )
        self._auth = {"Authorization": f"Bearer {token}"}
        self.transfer = Transfer()

    def close(self) -> None:
        self._conn.close()

    def _send(
        self, method: str, path: str, body: bytes | BinaryIO | None, length: int
    ) -> http.client.HTTPResponse:
        headers = {**self._auth, "Content-Length": str(length)}
        if body is not None:
            headers["Content-Type"] = "application/octet-stream"
        self._conn.request(method, path, body=body, headers=headers)
        self.transfer.bytes_sent += length
        return self._conn.getresponse()

    def _json(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        body = None if payload is None else json.dumps(payload).encode()
        resp = self._send(method, path, body, 0 if body is None else len(body))
        data = resp.read()
        self.transfer.bytes_received += len(data)
        if resp.status >= 300:
            raise BenchError(f"{method} {path}: HTTP {resp.status}: {data[:500]!r}")
        return json.loads(data) if data else None

    def _put_file(self, upload_id: str, name: str, item: Any) -> None:
        path = f"/v1/uploads/{upload_id}/files/{quote(name, safe='/')}"
        if isinstance(item, bytes):
            resp = self._send("PUT", path, item, len(item))
        else:
            with open(item, "rb") as f:
                resp = self._send("PUT", path, f, os.fstat(f.fileno()).st_size)
        data = resp.read()
        self.transfer.bytes_received += len(data)
        if resp.status >= 300:
            raise BenchError(f"PUT {path}: HTTP {resp.status}: {data[:500]!r}")

    def save(
        self,
        namespace: str,
        files: dict[str, Any],
        parent: str | None = None,
        inherit: bool = False,
        metadata: dict[str, Any] | None = None,
        tags: list[str] | None = None,
        chunking: str | None = None,
    ) -> RawCheckpoint:
        body: dict[str, Any] = {"parent": parent, "inherit": inherit}
        body.update(metadata=metadata or {}, tags=tags or [])
        if chunking is not None:
            body["chunking"] = chunking
        upload = self._json("POST", f"/v1/namespaces/{namespace}/uploads", body)
        for name, item in files.items():
            self._put_file(upload["upload_id"], name, item)
        rec = self._json("POST", f"/v1/uploads/{upload['upload_id']}/commit", {})
        return RawCheckpoint(rec["id"], rec["namespace"], rec["parent"], rec["size"], rec["files"])

    def load(self, namespace: str, ref: str = "latest-valid", dest: str | Path = ".") -> None:
        base = f"/v1/namespaces/{namespace}/checkpoints"
        rec = self._json("GET", f"{base}/{ref}")
        for name, info in rec["files"].items():
            target = Path(dest) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            resp = self._send("GET", f"{base}/{rec['id']}/files/{quote(name, safe='/')}", None, 0)
            if resp.status != 200:
                raise BenchError(f"GET {name}: HTTP {resp.status}: {resp.read()[:500]!r}")
            hasher = blake3.blake3()
            with target.open("wb") as out:
                while piece := resp.read(MiB):
                    hasher.update(piece)
                    out.write(piece)
                    self.transfer.bytes_received += len(piece)
            if hasher.hexdigest() != info["hash"]:
                raise BenchError(f"restored {name} does not hash to {info['hash']}")

    def stats(self) -> StatsReport:
        return StatsReport.from_wire(self._json("GET", "/v1/stats"))


def make_client(kind: str, url: str, token: str) -> Any:
    if kind == "raw":
        return RawHTTPClient(url, token)
    try:
        from checkpoint_vault.client import VaultClient
    except ImportError as e:
        raise BenchError(
            f"cannot import client.VaultClient ({e}); run with --client raw for the stand-in"
        ) from e
    # Progress bars (on when stderr is a terminal) would cost time inside the timed saves.
    return VaultClient(url=url, token=token, progress=False)


# -- the server ----------------------------------------------------------------------------


def wait_healthy(server: Server) -> float:
    """Poll GET /v1/health until it answers 200, at most STARTUP_TIMEOUT_S; seconds taken."""
    start = time.perf_counter()
    while True:
        server.check_alive()
        try:
            with urllib.request.urlopen(f"{server.url}/v1/health", timeout=2) as resp:
                if resp.status == 200:
                    return time.perf_counter() - start
        except (urllib.error.URLError, OSError):
            pass
        if time.perf_counter() - start > STARTUP_TIMEOUT_S:
            raise BenchError(f"server not healthy after {STARTUP_TIMEOUT_S:.0f} s")
        time.sleep(HEALTH_POLL_S)


# -- one series ----------------------------------------------------------------------------


@dataclass
class Checkpoint:
    """One generated checkpoint: its files on disk (and in memory for agent state)."""

    index: int
    paths: dict[str, Path]
    data: dict[str, bytes] | None = None

    @property
    def size(self) -> int:
        return sum(p.stat().st_size for p in self.paths.values())

    def payload(self) -> dict[str, Any]:
        """What save() gets: bytes for in-memory series, paths otherwise."""
        return dict(self.data) if self.data is not None else dict(self.paths)


@dataclass
class SeriesFigures:
    """Everything measured for one series; a table row set and, with --json, an object."""

    name: str
    namespace: str
    chunking: str
    checkpoints: int = 0
    generate_s: float = 0.0
    logical_bytes: int = 0
    last_checkpoint_bytes: int = 0
    baseline_write_s: float = 0.0
    baseline_write_mb_s: float = 0.0
    baseline_write_latency: dict[str, float] = field(default_factory=dict)
    baseline_read_s: float = 0.0
    baseline_read_mb_s: float = 0.0
    baseline_read_cache: str = ""
    ingest_s: float = 0.0
    ingest_mb_s: float = 0.0
    ingest_vs_write: float | None = None
    save_latency: dict[str, float] = field(default_factory=dict)
    sizes_match: bool = True
    restored: list[int] = field(default_factory=list)
    restore_bytes: int = 0
    restore_s: float = 0.0
    restore_mb_s: float = 0.0
    restore_vs_read: float | None = None
    restore_identical: bool = False
    bytes_sent: int = 0
    bytes_received_ingest: int = 0
    bytes_received_restore: int = 0
    stored_bytes_before: int = 0
    stored_bytes_after: int = 0
    stored_growth: int = 0
    logical_growth: int = 0
    chunks_growth: int = 0
    sent_vs_stored_growth: float | None = None
    sent_vs_logical: float | None = None
    dedup_ratio: float | None = None  # this series: logical growth / stored growth
    server_dedup_ratio: float | None = None  # the server's, all series so far
    stored_vs_last_checkpoint: float | None = None
    memory: dict[str, MemoryPeak] = field(default_factory=dict)
    client_maxrss_mib: float = 0.0


def generate(name: str, out: Path, seed: int, count: int | None) -> tuple[list[Checkpoint], float]:
    """Run bench/series.py in a child process; the checkpoints it wrote and its seconds."""
    cmd = [sys.executable, str(SERIES_SCRIPT), name, "--out", str(out), "--seed", str(seed)]
    cmd += ["--json"] + ([] if count is None else ["--count", str(count)])
    log(f"generating {name}: {' '.join(cmd[1:])}")
    try:
        done = subprocess.run(
            cmd, stdout=subprocess.PIPE, check=False, timeout=GENERATE_TIMEOUT_S, text=True
        )
    except subprocess.TimeoutExpired as e:
        raise BenchError(f"generating {name} took over {GENERATE_TIMEOUT_S:.0f} s") from e
    if done.returncode != 0:
        raise BenchError(f"series.py {name} exited {done.returncode}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    ckpts = []
    for i, files in enumerate(summary["files"]):
        paths = {f: out / f"ckpt-{i:03d}" / f for f in files}
        data = {f: p.read_bytes() for f, p in paths.items()} if name in IN_MEMORY else None
        ckpts.append(Checkpoint(i, paths, data))
    return ckpts, float(summary["seconds"])


def _copy_fsync(src: Path, dst: Path) -> None:
    with src.open("rb", buffering=0) as fin, dst.open("wb") as fout:
        while piece := fin.read(PIECE):
            fout.write(piece)  # the buffered writer writes large pieces whole, straight through
        fout.flush()
        os.fsync(fout.fileno())


def _write_fsync(data: bytes, dst: Path) -> None:
    with dst.open("wb") as fout:
        fout.write(data)
        fout.flush()
        os.fsync(fout.fileno())


def _read_all(path: Path) -> int:
    total = 0
    with path.open("rb", buffering=0) as f:
        while piece := f.read(PIECE):
            total += len(piece)
    return total


def run_baseline(fig: SeriesFigures, ckpts: list[Checkpoint], work: Path) -> None:
    """Write every checkpoint's bytes to local files with fsync, then read them back."""
    log(f"{fig.name}: baseline write + fsync, then read back")
    latencies: list[float] = []
    copies: list[Path] = []
    for ck in ckpts:
        target = work / f"ckpt-{ck.index:03d}"
        target.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        for fname, src in ck.paths.items():
            dst = target / fname
            dst.parent.mkdir(parents=True, exist_ok=True)
            if ck.data is not None:
                _write_fsync(ck.data[fname], dst)
            else:
                _copy_fsync(src, dst)
            copies.append(dst)
        latencies.append(time.perf_counter() - start)
    fig.baseline_write_s = sum(latencies)
    fig.baseline_write_mb_s = mb_per_s(fig.logical_bytes, fig.baseline_write_s)
    fig.baseline_write_latency = latency_summary(latencies)
    fig.baseline_read_cache = describe_cache(cache_residency(copies[-1]))
    start = time.perf_counter()
    nread = sum(_read_all(p) for p in copies)
    fig.baseline_read_s = time.perf_counter() - start
    if nread != fig.logical_bytes:
        raise BenchError(f"{fig.name}: baseline read {nread} bytes, expected {fig.logical_bytes}")
    fig.baseline_read_mb_s = mb_per_s(nread, fig.baseline_read_s)
    shutil.rmtree(work, ignore_errors=True)


def run_ingest(
    fig: SeriesFigures, ckpts: list[Checkpoint], client: Any, sampler: RssSampler
) -> list[str]:
    """Save every checkpoint, parent = the previous one; the checkpoint ids."""
    log(f"{fig.name}: ingest {len(ckpts)} checkpoints into {fig.namespace}")
    before = client.stats()
    sent0, recv0 = client.transfer.bytes_sent, client.transfer.bytes_received
    ids: list[str] = []
    latencies: list[float] = []
    sampler.reset()
    for ck in ckpts:
        start = time.perf_counter()
        saved = client.save(
            fig.namespace,
            ck.payload(),
            parent=ids[-1] if ids else None,
            metadata={"series": fig.name, "index": ck.index},
            chunking=fig.chunking,
        )
        latencies.append(time.perf_counter() - start)
        ids.append(saved.id)
        if int(saved.size) != ck.size:
            fig.sizes_match = False
            log(f"{fig.name}: checkpoint {ck.index} size {saved.size}, expected {ck.size}")
    fig.memory["server_ingest"] = sampler.peak("server")
    fig.memory["client_ingest"] = sampler.peak("client")
    after = client.stats()
    fig.ingest_s = sum(latencies)
    fig.ingest_mb_s = mb_per_s(fig.logical_bytes, fig.ingest_s)
    fig.ingest_vs_write = ratio(fig.ingest_mb_s, fig.baseline_write_mb_s)
    fig.save_latency = latency_summary(latencies)
    fig.bytes_sent = client.transfer.bytes_sent - sent0
    fig.bytes_received_ingest = client.transfer.bytes_received - recv0
    record_storage(fig, before, after)
    return ids


def record_storage(fig: SeriesFigures, before: StatsReport, after: StatsReport) -> None:
    fig.stored_bytes_before = before.stored_bytes
    fig.stored_bytes_after = after.stored_bytes
    fig.stored_growth = fig.stored_bytes_after - fig.stored_bytes_before
    fig.logical_growth = after.logical_bytes - before.logical_bytes
    fig.chunks_growth = after.chunks - before.chunks
    fig.sent_vs_stored_growth = ratio(fig.bytes_sent, fig.stored_growth)
    fig.sent_vs_logical = ratio(fig.bytes_sent, fig.logical_bytes)
    fig.dedup_ratio = ratio(fig.logical_growth, fig.stored_growth)
    fig.server_dedup_ratio = after.dedup_ratio
    fig.stored_vs_last_checkpoint = ratio(fig.stored_growth, fig.last_checkpoint_bytes)


def same_files(ck: Checkpoint, restored: Path) -> bool:
    for fname, src in ck.paths.items():
        got = restored / fname
        if not got.is_file() or not filecmp.cmp(src, got, shallow=False):
            log(f"restored {got} differs from {src}")
            return False
    return True


def run_restore(
    fig: SeriesFigures,
    ckpts: list[Checkpoint],
    ids: list[str],
    client: Any,
    sampler: RssSampler,
    work: Path,
    last: int,
) -> None:
    """Load the last `last` checkpoints (all when 0) into fresh dirs; compare, not timed."""
    chosen = ckpts if last <= 0 else ckpts[-last:]
    log(f"{fig.name}: restore {len(chosen)} checkpoint(s)")
    recv0 = client.transfer.bytes_received
    identical = True
    sampler.reset()
    for ck in chosen:
        dest = work / f"ckpt-{ck.index:03d}"
        start = time.perf_counter()
        client.load(fig.namespace, ref=ids[ck.index], dest=dest)
        fig.restore_s += time.perf_counter() - start
        fig.restore_bytes += ck.size
        fig.restored.append(ck.index)
        identical = same_files(ck, dest) and identical
        shutil.rmtree(dest, ignore_errors=True)
    fig.memory["server_restore"] = sampler.peak("server")
    fig.memory["client_restore"] = sampler.peak("client")
    fig.bytes_received_restore = client.transfer.bytes_received - recv0
    fig.restore_identical = identical
    fig.restore_mb_s = mb_per_s(fig.restore_bytes, fig.restore_s)
    fig.restore_vs_read = ratio(fig.restore_mb_s, fig.baseline_read_mb_s)


@dataclass
class RunContext:
    client: Any
    sampler: RssSampler
    tmp: Path
    seed: int
    count: int | None
    restore_last: int
    keep: bool


def run_series(name: str, ctx: RunContext, results: dict[str, SeriesFigures]) -> None:
    """Generate, baseline, ingest and restore one series; its figures go into `results`
    at once, so a failure part-way still reports what was measured."""
    fig = SeriesFigures(name=name, namespace=f"bench/{name}", chunking=CHUNKING[name])
    results[name] = fig
    gen_dir = ctx.tmp / "series" / name
    ckpts, fig.generate_s = generate(name, gen_dir, ctx.seed, ctx.count)
    fig.checkpoints = len(ckpts)
    fig.logical_bytes = sum(ck.size for ck in ckpts)
    fig.last_checkpoint_bytes = ckpts[-1].size
    log(
        f"{name}: {fig.checkpoints} checkpoints, {_mb(fig.logical_bytes)}, "
        f"generated in {fig.generate_s:.1f} s"
    )
    run_baseline(fig, ckpts, ctx.tmp / "baseline" / name)
    ids = run_ingest(fig, ckpts, ctx.client, ctx.sampler)
    run_restore(
        fig, ckpts, ids, ctx.client, ctx.sampler, ctx.tmp / "restore" / name, ctx.restore_last
    )
    fig.client_maxrss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / KiB
    if not ctx.keep:
        shutil.rmtree(gen_dir, ignore_errors=True)


# -- the run -------------------------------------------------------------------------------


@dataclass
class RunFigures:
    client: str
    seed: int
    temp_dir: str
    series: dict[str, SeriesFigures] = field(default_factory=dict)
    server_startup_s: float = 0.0
    server_idle: MemoryPeak = field(default_factory=MemoryPeak)
    server_exit_code: int | None = None
    server_stop_s: float = 0.0
    server_killed: bool = False
    final_stats: dict[str, Any] = field(default_factory=dict)
    client_maxrss_mib: float = 0.0
    error: str | None = None


def run(args: argparse.Namespace) -> RunFigures:
    tmp = Path(tempfile.mkdtemp(prefix="ckpt-bench-client-", dir=args.tmpdir))
    figs = RunFigures(client=args.client, seed=args.seed, temp_dir=str(tmp))
    log(f"temp dir {tmp}")
    server = Server(data_dir=tmp / "vault", log_path=tmp / "server.log")
    try:
        server.start()
        try:
            figs.server_startup_s = wait_healthy(server)
            client = make_client(args.client, server.url, server.token())
            try:
                with RssSampler({"server": server.pid, "client": os.getpid()}) as sampler:
                    figs.server_idle = sampler.peak("server")
                    ctx = RunContext(
                        client, sampler, tmp, args.seed, args.count, args.restore_last, args.keep
                    )
                    for name in args.series:
                        run_series(name, ctx, figs.series)
                        server.check_alive()
                    figs.final_stats = client.stats().to_wire()
            finally:
                client.close()
        except Exception as e:  # report what was measured before the failure
            figs.error = f"{type(e).__name__}: {e}"
            if not isinstance(e, BenchError):
                log(traceback.format_exc().rstrip())
            log(f"error: {figs.error}; server log tail:\n{server.log_tail()}")
        finally:
            figs.server_exit_code, figs.server_stop_s, figs.server_killed = server.stop()
            log(f"server stopped: exit code {figs.server_exit_code}")
    finally:
        if args.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    figs.client_maxrss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / KiB
    return figs


# -- output --------------------------------------------------------------------------------


def _mb(n: int) -> str:
    return f"{n / MB:,.1f} MB" if abs(n) >= MB else f"{n / 1000:,.1f} kB"


def _x(value: float | None, unit: str = "x") -> str:
    return "-" if value is None else f"{value:.2f}{unit}"


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _mem(m: MemoryPeak | None) -> str:
    return "-" if m is None else f"{_mib(m.vm_rss_mib)} / {_mib(m.rss_anon_mib)}"


def _lat(d: dict[str, float]) -> str:
    return f"{d['p50_ms']:.1f} / {d['p99_ms']:.1f}" if d else "-"


def series_rows(f: SeriesFigures) -> Iterator[tuple[str, str]]:
    yield "checkpoints / chunking", f"{f.checkpoints} / {f.chunking}"
    yield "generated (series.py)", f"{_mb(f.logical_bytes)} in {f.generate_s:.1f} s"
    yield "last checkpoint", _mb(f.last_checkpoint_bytes)
    yield "local write + fsync", f"{f.baseline_write_s:.2f} s, {f.baseline_write_mb_s:.1f} MB/s"
    yield (
        "local read",
        f"{f.baseline_read_s:.2f} s, {f.baseline_read_mb_s:.1f} MB/s ({f.baseline_read_cache})",
    )
    yield (
        "ingest (save)",
        (
            f"{f.ingest_s:.2f} s, {f.ingest_mb_s:.1f} MB/s = {_x(f.ingest_vs_write)} local write"
            + ("" if f.sizes_match else "  SIZE MISMATCH")
        ),
    )
    yield (
        "save latency p50 / p99 ms",
        (f"{_lat(f.save_latency)} (local write+fsync {_lat(f.baseline_write_latency)})"),
    )
    yield (
        "restore (load)",
        (
            f"{len(f.restored)} ckpt, {_mb(f.restore_bytes)} in {f.restore_s:.2f} s, "
            f"{f.restore_mb_s:.1f} MB/s = {_x(f.restore_vs_read)} local read; "
            f"identical: {f.restore_identical}"
        ),
    )
    yield (
        "bytes sent (ingest)",
        (
            f"{_mb(f.bytes_sent)} = {_x(f.sent_vs_logical)} logical, "
            f"{_x(f.sent_vs_stored_growth)} stored growth"
        ),
    )
    yield (
        "bytes received",
        (f"ingest {_mb(f.bytes_received_ingest)}, restore {_mb(f.bytes_received_restore)}"),
    )
    yield (
        "stored_bytes growth",
        (f"{_mb(f.stored_growth)} (now {_mb(f.stored_bytes_after)}), {f.chunks_growth} new chunks"),
    )
    yield (
        "dedup (logical / stored)",
        (f"{_x(f.dedup_ratio)} this series; server {_x(f.server_dedup_ratio)}"),
    )
    yield "stored growth / last ckpt", _x(f.stored_vs_last_checkpoint)
    yield (
        "server MiB VmRSS / RssAnon",
        (
            f"ingest {_mem(f.memory.get('server_ingest'))}, "
            f"restore {_mem(f.memory.get('server_restore'))}"
        ),
    )
    yield (
        "client MiB VmRSS / RssAnon",
        (
            f"ingest {_mem(f.memory.get('client_ingest'))}, "
            f"restore {_mem(f.memory.get('client_restore'))}; ru_maxrss {f.client_maxrss_mib:.0f}"
        ),
    )


def report(figs: RunFigures) -> str:
    parts = [
        f"Checkpoint Vault client benchmark (client: {figs.client}, seed {figs.seed}); "
        "MB = 10^6 bytes, memory in MiB",
        f"server healthy after {figs.server_startup_s:.2f} s, idle VmRSS / RssAnon "
        f"{_mem(figs.server_idle)}; SIGTERM -> exit code {figs.server_exit_code} after "
        f"{figs.server_stop_s:.2f} s" + (" (killed)" if figs.server_killed else ""),
    ]
    for name, f in figs.series.items():
        parts += [
            "",
            table(
                f"Series {name} (namespace {f.namespace})",
                ("figure", "value"),
                list(series_rows(f)),
            ),
        ]
    parts += [
        "",
        "Ingest reads page-cached files (written just before); local reads are usually from "
        "the page cache too (each row says). Restore writes files, the local read does not. "
        "Client and server share the 2 CPUs over loopback. stored_bytes is after zstd.",
    ]
    if figs.error:
        parts.append(f"ERROR: {figs.error}")
    return "\n".join(parts)


def parse_series(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [n for n in names if n not in ALL_SERIES]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown series {bad}; choose from {','.join(ALL_SERIES)}"
        )
    return list(dict.fromkeys(names))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench_client.py",
        description="Realistic checkpoint series through VaultClient vs the local disk.",
    )
    p.add_argument(
        "--series",
        type=parse_series,
        default=list(ALL_SERIES),
        help="comma-separated (default all)",
    )
    p.add_argument("--seed", type=int, default=0, help="series seed (default 0)")
    p.add_argument(
        "--count", type=int, default=None, help="checkpoints per series (default: the series')"
    )
    p.add_argument(
        "--restore-last",
        type=int,
        default=3,
        help="restore the last N checkpoints (0: all; default 3)",
    )
    p.add_argument(
        "--client",
        choices=("vault", "raw"),
        default="vault",
        help="VaultClient (default) or the stdlib stand-in",
    )
    p.add_argument("--json", action="store_true", help="also print all figures as one JSON object")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (series, vault, log)")
    p.add_argument("--tmpdir", type=Path, default=None, help="where to create the temp dir")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.count is not None and args.count < 1:
        print("bench_client: --count must be at least 1", file=sys.stderr)
        return 2
    figs = run(args)
    print(report(figs))
    if args.json:
        print(json.dumps(asdict(figs), sort_keys=True))
    ok = (
        figs.error is None
        and figs.server_exit_code == 0
        and all(f.restore_identical and f.sizes_match for f in figs.series.values())
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
