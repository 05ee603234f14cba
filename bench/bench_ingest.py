"""Ingest and download throughput of a real Checkpoint Vault server, against the local disk.

Run by hand, never by the test suite:

    python bench/bench_ingest.py --size 256MiB [--keep] [--json] [--no-dedup]

What it does, in one temp dir:

1. writes N bytes of seeded random data to `source.bin` in 8 MiB pieces (never holding more
   than a piece or two in memory);
2. baseline: copies it to `baseline.bin` in 8 MiB writes + fsync, then reads that back in
   8 MiB reads (nothing is dropped from the page cache; the output says if it was cached);
3. starts `python -m cli serve` on a free loopback port as a separate process;
4. streams `source.bin` through `PUT /v1/uploads/{id}/files/data.bin` and commits
   (timed from the start of the PUT to the end of the commit);
5. downloads `latest/files/data.bin`, hashing it with BLAKE3 against the PUT answer;
6. samples the server's (and its own) VmRSS every 50 ms per phase, and the server's VmHWM;
7. with `--dedup` (default): uploads a second version with 1 MiB changed in the middle and
   reports how much `stored_bytes` grew;
8. stops the server with SIGTERM and reports its exit code.

MB/s figures use MB = 10^6 bytes; sizes are in MiB (2^20 bytes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO

import aiohttp
import blake3

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
MB = 1_000_000
PIECE = 8 * MiB  # every local read/write and every streamed piece is this size
DEDUP_WINDOW = 1 * MiB
NAMESPACE = "bench"
FILE_NAME = "data.bin"
HOST = "127.0.0.1"
STARTUP_TIMEOUT_S = 60.0
HEALTH_POLL_S = 0.1
STOP_TIMEOUT_S = 60.0
RSS_SAMPLE_S = 0.05
CACHE_PROBES = 64

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?", re.IGNORECASE)
_UNITS = {
    "": 1,
    "b": 1,
    "k": KiB,
    "kib": KiB,
    "kb": 1000,
    "m": MiB,
    "mib": MiB,
    "mb": MB,
    "g": GiB,
    "gib": GiB,
    "gb": 1000 * MB,
    "t": 1 << 40,
    "tib": 1 << 40,
    "tb": 1000 * 1000 * MB,
}


class BenchError(RuntimeError):
    """The benchmark cannot go on; the message says why."""


def parse_size(text: str) -> int:
    """Bytes from `1GiB`, `256MiB`, `512M` (binary), `1GB` (decimal) or a plain integer."""
    m = _SIZE.fullmatch(text.strip())
    unit = (m.group(2) or "").lower() if m else None
    if m is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 1GiB, 256MiB)")
    size = int(float(m.group(1)) * _UNITS[unit])
    if size < 1:
        raise argparse.ArgumentTypeError(f"size must be at least 1 byte, got {text!r}")
    return size


def mb_per_s(nbytes: int, seconds: float) -> float:
    return nbytes / MB / seconds if seconds > 0 else float("inf")


def log(message: str) -> None:
    """Progress goes to stderr so stdout holds only the results."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# -- data ----------------------------------------------------------------------------------


class RandomBytes:
    """A seeded, fast byte generator: numpy's PCG64 when numpy is there, else `random`."""

    def __init__(self, seed: int) -> None:
        self.kind: str
        self._next: Callable[[int], bytes]
        try:
            import numpy as np
        except ImportError:
            import random

            self.kind = "random.Random.randbytes"
            self._next = random.Random(seed).randbytes
        else:
            self.kind = "numpy default_rng.bytes"
            self._next = np.random.default_rng(seed).bytes

    def __call__(self, n: int) -> bytes:
        return self._next(n)


def write_random(path: Path, size: int, rng: RandomBytes) -> str:
    """Write `size` random bytes in pieces, fsync; answer the BLAKE3 hex of the content."""
    hasher = blake3.blake3()
    with path.open("wb") as f:
        left = size
        while left:
            piece = rng(min(PIECE, left))
            hasher.update(piece)
            f.write(piece)
            left -= len(piece)
        f.flush()
        os.fsync(f.fileno())
    return hasher.hexdigest()


def _copy(src: BinaryIO, dst: BinaryIO, n: int, hasher: Any) -> None:
    while n:
        piece = src.read(min(PIECE, n))
        if not piece:
            raise BenchError("source file is shorter than expected")
        hasher.update(piece)
        dst.write(piece)
        n -= len(piece)


def write_variant(src: Path, dst: Path, start: int, length: int, rng: RandomBytes) -> str:
    """Copy `src` to `dst` with bytes [start, start+length) replaced by fresh random ones."""
    size = src.stat().st_size
    hasher = blake3.blake3()
    with src.open("rb") as fin, dst.open("wb") as fout:
        _copy(fin, fout, start, hasher)
        window = rng(length)
        hasher.update(window)
        fout.write(window)
        fin.seek(start + length)
        _copy(fin, fout, size - start - length, hasher)
        fout.flush()
        os.fsync(fout.fileno())
    return hasher.hexdigest()


def cache_residency(path: Path, probes: int = CACHE_PROBES) -> float | None:
    """Fraction of evenly spaced pages of `path` already in the page cache, or None when the
    kernel cannot tell (reads with RWF_NOWAIT fail with EAGAIN on a cache miss)."""
    flag = getattr(os, "RWF_NOWAIT", None)
    size = path.stat().st_size
    if flag is None or size == 0:
        return None
    buf = bytearray(4 * KiB)
    hits = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        for i in range(probes):
            offset = (size - 1) * i // max(probes - 1, 1)
            try:
                os.preadv(fd, [buf], offset - offset % len(buf), flag)
                hits += 1
            except BlockingIOError:
                pass
            except OSError:
                return None
    finally:
        os.close(fd)
    return hits / probes


def describe_cache(fraction: float | None) -> str:
    if fraction is None:
        return "page-cache residency unknown"
    if fraction >= 0.99:
        return "from the page cache"
    if fraction <= 0.01:
        return "from disk (not cached)"
    return f"~{fraction:.0%} from the page cache"


# -- local baseline ------------------------------------------------------------------------


def baseline_write(src: Path, dst: Path) -> float:
    """Seconds to copy `src` (page-cached) into `dst` in 8 MiB writes, fsync included."""
    start = time.perf_counter()
    with src.open("rb", buffering=0) as fin, dst.open("wb", buffering=0) as fout:
        while piece := fin.read(PIECE):
            fout.write(piece)
        os.fsync(fout.fileno())
    return time.perf_counter() - start


def baseline_read(path: Path) -> tuple[float, int]:
    """Seconds to read `path` in 8 MiB reads, and the bytes read."""
    total = 0
    start = time.perf_counter()
    with path.open("rb", buffering=0) as f:
        while piece := f.read(PIECE):
            total += len(piece)
    return time.perf_counter() - start, total


# -- memory --------------------------------------------------------------------------------


RSS_KEYS = ("VmRSS", "RssAnon")  # all resident pages / anonymous ones (heap, buffers)


def proc_status_kib(pid: int) -> dict[str, int]:
    """The `kB` lines of /proc/PID/status (VmRSS, RssAnon, RssFile, VmHWM, ...) in KiB;
    empty if the process is gone."""
    values: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if len(parts) == 2 and parts[1] == "kB":
                    values[key] = int(parts[0])
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return {}
    return values


@dataclass
class MemoryPeak:
    """Peak resident memory of one process over one phase, in MiB.

    `vm_rss_mib` counts every resident page, including pages of the LMDB file the server
    has mapped (they are page cache, shared and reclaimable); `rss_anon_mib` counts only
    anonymous memory (heap, buffers), the figure that shows whether memory stays bounded.
    """

    vm_rss_mib: float | None = None
    rss_anon_mib: float | None = None


class RssSampler:
    """Samples VmRSS and RssAnon of some processes every RSS_SAMPLE_S from a daemon thread
    and keeps the peak of each since the last `reset()`."""

    def __init__(self, pids: dict[str, int]) -> None:
        self._pids = pids
        self._peaks: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _sample(self) -> None:
        for name, pid in self._pids.items():
            status = proc_status_kib(pid)
            with self._lock:
                for key in RSS_KEYS:
                    if key in status:
                        old = self._peaks.get((name, key), 0)
                        self._peaks[(name, key)] = max(old, status[key])

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(RSS_SAMPLE_S)

    def reset(self) -> None:
        with self._lock:
            self._peaks.clear()
        self._sample()

    def peak(self, name: str) -> MemoryPeak:
        """Peaks of one process since the last reset (one last sample included)."""
        self._sample()
        with self._lock:
            rss = self._peaks.get((name, "VmRSS"))
            anon = self._peaks.get((name, "RssAnon"))
        return MemoryPeak(None if rss is None else rss / KiB, None if anon is None else anon / KiB)


# -- the server process --------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """`python -m cli serve` on loopback, its output going to a log file."""

    data_dir: Path
    log_path: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise BenchError("server not started")
        return self.proc.pid

    def start(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "checkpoint_vault.cli",
            "serve",
            "--data",
            str(self.data_dir),
            "--host",
            HOST,
            "--port",
            str(self.port),
        ]
        log(f"starting server: {' '.join(cmd)}")
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.log_path.parent
        )

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise BenchError(
                f"server exited with code {self.proc.returncode}; log tail:\n{self.log_tail()}"
            )

    def token(self) -> str:
        path = self.data_dir / "admin.token"
        try:
            return path.read_text().strip()
        except OSError as e:
            raise BenchError(f"cannot read the admin token at {path}: {e}") from e

    def stop(self) -> tuple[int | None, float, bool]:
        """SIGTERM, bounded wait (SIGKILL after it); (exit code, seconds to exit, killed)."""
        if self.proc is None:
            return None, 0.0, False
        killed = False
        start = time.perf_counter()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log(f"server did not exit {STOP_TIMEOUT_S:.0f} s after SIGTERM; killing it")
                self.proc.kill()
                self.proc.wait(timeout=STOP_TIMEOUT_S)
                killed = True
        elapsed = time.perf_counter() - start
        if self._log is not None:
            self._log.close()
        return self.proc.returncode, elapsed, killed


# -- HTTP ----------------------------------------------------------------------------------


async def check(resp: aiohttp.ClientResponse, what: str) -> Any:
    """The JSON answer of a 2xx response; a BenchError naming the vault's error otherwise."""
    if resp.status >= 300:
        text = await resp.text(errors="replace")
        raise BenchError(f"{what}: HTTP {resp.status}: {text[:500]}")
    return await resp.json()


async def wait_healthy(session: aiohttp.ClientSession, server: Server) -> float:
    """Poll GET /v1/health until it answers 200; seconds it took."""
    start = time.perf_counter()
    deadline = start + STARTUP_TIMEOUT_S
    while True:
        server.check_alive()
        try:
            async with session.get(
                f"{server.url}/v1/health", timeout=aiohttp.ClientTimeout(total=2)
            ) as resp:
                if resp.status == 200:
                    return time.perf_counter() - start
        except (aiohttp.ClientError, asyncio.TimeoutError):
            pass
        if time.perf_counter() > deadline:
            raise BenchError(f"server not healthy after {STARTUP_TIMEOUT_S:.0f} s")
        await asyncio.sleep(HEALTH_POLL_S)


async def file_pieces(f: BinaryIO) -> AsyncIterator[bytes]:
    """The file in 8 MiB pieces, each read in a worker thread: one piece in flight."""
    while piece := await asyncio.to_thread(f.read, PIECE):
        yield piece


@dataclass
class UploadResult:
    put_s: float
    commit_s: float
    total_s: float
    hash: str
    size: int
    chunks: int
    checkpoint_id: str


async def upload(
    session: aiohttp.ClientSession, url: str, path: Path, parent: str | None
) -> UploadResult:
    """Open an upload, stream `path` as FILE_NAME, commit. Timed from PUT start to commit end."""
    body: dict[str, Any] = {} if parent is None else {"parent": parent}
    async with session.post(f"{url}/v1/namespaces/{NAMESPACE}/uploads", json=body) as resp:
        upload_id = (await check(resp, "open upload"))["upload_id"]
    f: BinaryIO = await asyncio.to_thread(open, path, "rb", 0)
    with f:
        size = os.fstat(f.fileno()).st_size
        start = time.perf_counter()
        async with session.put(
            f"{url}/v1/uploads/{upload_id}/files/{FILE_NAME}",
            data=file_pieces(f),
            headers={"Content-Length": str(size), "Content-Type": "application/octet-stream"},
        ) as resp:
            put = await check(resp, "PUT file")
    put_done = time.perf_counter()
    async with session.post(f"{url}/v1/uploads/{upload_id}/commit", json={}) as resp:
        record = await check(resp, "commit")
    end = time.perf_counter()
    if put.get("size") != size:
        raise BenchError(f"server stored {put.get('size')} bytes, sent {size}")
    return UploadResult(
        put_s=put_done - start,
        commit_s=end - put_done,
        total_s=end - start,
        hash=str(put["hash"]),
        size=int(put["size"]),
        chunks=int(put["chunks"]),
        checkpoint_id=str(record["id"]),
    )


async def download(session: aiohttp.ClientSession, url: str) -> tuple[float, int, str]:
    """Stream latest/files/FILE_NAME, hashing and discarding it: (seconds, bytes, BLAKE3 hex)."""
    hasher = blake3.blake3()
    total = 0
    start = time.perf_counter()
    async with session.get(
        f"{url}/v1/namespaces/{NAMESPACE}/checkpoints/latest/files/{FILE_NAME}"
    ) as resp:
        if resp.status != 200:
            await check(resp, "download")
            raise BenchError(f"download: HTTP {resp.status}")
        async for piece in resp.content.iter_chunked(PIECE):
            hasher.update(piece)
            total += len(piece)
    return time.perf_counter() - start, total, hasher.hexdigest()


async def stats(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(f"{url}/v1/stats") as resp:
        result: dict[str, Any] = await check(resp, "stats")
    return result


# -- the run -------------------------------------------------------------------------------


@dataclass
class Figures:
    """Everything the run measured; printed as a table and, with --json, as one object."""

    size_bytes: int
    seed: int
    generator: str
    temp_dir: str
    source_blake3: str = ""
    generate_s: float = 0.0
    baseline_write_s: float = 0.0
    baseline_write_mb_s: float = 0.0
    baseline_read_s: float = 0.0
    baseline_read_mb_s: float = 0.0
    baseline_read_cache: str = ""
    server_startup_s: float = 0.0
    ingest_put_s: float = 0.0
    ingest_commit_s: float = 0.0
    ingest_s: float = 0.0
    ingest_mb_s: float = 0.0
    ingest_vs_baseline_write: float = 0.0
    ingest_hash_matches_local: bool = False
    chunks: int = 0
    checkpoint_id: str = ""
    stored_bytes_after_ingest: int | None = None
    download_s: float = 0.0
    download_mb_s: float = 0.0
    download_vs_baseline_read: float = 0.0
    download_hash_ok: bool = False
    vault_data_cache: str = ""
    # "server_idle", "server_ingest", "server_download", "server_dedup_ingest", "client_..."
    memory: dict[str, MemoryPeak] = field(default_factory=dict)
    server_vmhwm_after_ingest_mib: float | None = None
    dedup: dict[str, Any] | None = None
    client_maxrss_mib: float = 0.0
    server_exit_code: int | None = None
    server_stop_s: float = 0.0
    server_killed: bool = False
    notes: list[str] = field(default_factory=list)


def largest_file(root: Path) -> Path | None:
    files = [p for p in root.rglob("*") if p.is_file()]
    return max(files, key=lambda p: p.stat().st_size, default=None)


async def run_dedup(
    session: aiohttp.ClientSession,
    server: Server,
    sampler: RssSampler,
    variant: Path,
    variant_hash: str,
) -> dict[str, Any]:
    before = await stats(session, server.url)
    sampler.reset()
    result = await upload(session, server.url, variant, parent="latest")
    memory = sampler.peak("server")
    after = await stats(session, server.url)
    grew = int(after["stored_bytes"]) - int(before["stored_bytes"])
    return {
        "changed_bytes": DEDUP_WINDOW,
        "ingest_s": result.total_s,
        "ingest_put_s": result.put_s,
        "ingest_commit_s": result.commit_s,
        "ingest_mb_s": mb_per_s(result.size, result.total_s),
        "hash_matches_local": result.hash == variant_hash,
        "chunks": result.chunks,
        "stored_bytes_before": int(before["stored_bytes"]),
        "stored_bytes_after": int(after["stored_bytes"]),
        "stored_bytes_growth": grew,
        "chunks_growth": int(after["chunks"]) - int(before["chunks"]),
        "logical_bytes_growth": int(after["logical_bytes"]) - int(before["logical_bytes"]),
        "dedup_ratio": after.get("dedup_ratio"),
        "server_memory": memory,
        "checkpoint_id": result.checkpoint_id,
    }


async def run_server_phases(
    fig: Figures, server: Server, source: Path, variant: Path | None, variant_hash: str
) -> None:
    """Everything that talks to the server: health, ingest, download, dedup."""
    timeout = aiohttp.ClientTimeout(total=None, connect=30, sock_read=600)
    async with aiohttp.ClientSession(timeout=timeout) as bare:
        fig.server_startup_s = await wait_healthy(bare, server)
    headers = {"Authorization": f"Bearer {server.token()}"}
    pids = {"server": server.pid, "client": os.getpid()}
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        with RssSampler(pids) as sampler:
            fig.memory["server_idle"] = sampler.peak("server")
            log(f"ingest: PUT {fig.size_bytes / MiB:.0f} MiB + commit")
            sampler.reset()
            up = await upload(session, server.url, source, parent=None)
            fig.memory["server_ingest"] = sampler.peak("server")
            fig.memory["client_ingest"] = sampler.peak("client")
            hwm = proc_status_kib(server.pid).get("VmHWM")
            fig.server_vmhwm_after_ingest_mib = None if hwm is None else hwm / KiB
            fig.ingest_put_s, fig.ingest_commit_s, fig.ingest_s = (
                up.put_s,
                up.commit_s,
                up.total_s,
            )
            fig.ingest_mb_s = mb_per_s(up.size, up.total_s)
            fig.ingest_vs_baseline_write = fig.ingest_mb_s / fig.baseline_write_mb_s
            fig.ingest_hash_matches_local = up.hash == fig.source_blake3
            fig.chunks, fig.checkpoint_id = up.chunks, up.checkpoint_id
            fig.stored_bytes_after_ingest = int((await stats(session, server.url))["stored_bytes"])

            data_file = largest_file(server.data_dir)
            fig.vault_data_cache = (
                describe_cache(cache_residency(data_file)) if data_file else "unknown"
            )
            log("download: GET latest/files/data.bin")
            sampler.reset()
            seconds, nbytes, digest = await download(session, server.url)
            fig.memory["server_download"] = sampler.peak("server")
            fig.memory["client_download"] = sampler.peak("client")
            if nbytes != fig.size_bytes:
                raise BenchError(f"download returned {nbytes} bytes, expected {fig.size_bytes}")
            fig.download_s = seconds
            fig.download_mb_s = mb_per_s(nbytes, seconds)
            fig.download_vs_baseline_read = fig.download_mb_s / fig.baseline_read_mb_s
            fig.download_hash_ok = digest == up.hash

            if variant is not None:
                log("dedup: second version with 1 MiB changed in the middle")
                fig.dedup = await run_dedup(session, server, sampler, variant, variant_hash)
                fig.memory["server_dedup_ingest"] = fig.dedup.pop("server_memory")


def prepare_data(fig: Figures, tmp: Path, dedup: bool) -> tuple[Path, Path | None, str]:
    """Source file, optional variant, and the local baseline figures."""
    rng = RandomBytes(fig.seed)
    fig.generator = rng.kind
    source = tmp / "source.bin"
    log(f"generating {fig.size_bytes / MiB:.1f} MiB of random data ({rng.kind})")
    start = time.perf_counter()
    fig.source_blake3 = write_random(source, fig.size_bytes, rng)
    fig.generate_s = time.perf_counter() - start

    variant: Path | None = None
    variant_hash = ""
    if dedup and fig.size_bytes >= 2 * DEDUP_WINDOW:
        variant = tmp / "source-v2.bin"
        log("generating the second version (1 MiB changed in the middle)")
        window_start = (fig.size_bytes - DEDUP_WINDOW) // 2
        variant_hash = write_variant(
            source, variant, window_start, DEDUP_WINDOW, RandomBytes(fig.seed + 1)
        )
    elif dedup:
        fig.notes.append("dedup scenario skipped: --size is below 2 MiB")

    log("baseline: local write + fsync, then read back")
    baseline = tmp / "baseline.bin"
    fig.baseline_write_s = baseline_write(source, baseline)
    fig.baseline_write_mb_s = mb_per_s(fig.size_bytes, fig.baseline_write_s)
    fig.baseline_read_cache = describe_cache(cache_residency(baseline))
    fig.baseline_read_s, nread = baseline_read(baseline)
    if nread != fig.size_bytes:
        raise BenchError(f"baseline read {nread} bytes, expected {fig.size_bytes}")
    fig.baseline_read_mb_s = mb_per_s(nread, fig.baseline_read_s)
    baseline.unlink()  # only the figures are needed; spare the disk
    return source, variant, variant_hash


def run(args: argparse.Namespace) -> Figures:
    tmp = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.tmpdir))
    fig = Figures(size_bytes=args.size, seed=args.seed, generator="", temp_dir=str(tmp))
    log(f"temp dir {tmp}")
    server = Server(data_dir=tmp / "vault", log_path=tmp / "server.log")
    try:
        source, variant, variant_hash = prepare_data(fig, tmp, args.dedup)
        server.start()
        try:
            asyncio.run(run_server_phases(fig, server, source, variant, variant_hash))
        finally:
            fig.server_exit_code, fig.server_stop_s, fig.server_killed = server.stop()
            log(f"server stopped: exit code {fig.server_exit_code}")
    finally:
        if args.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    fig.client_maxrss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / KiB
    return fig


# -- output --------------------------------------------------------------------------------


def table(title: str, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:-1], widths[1:-1], strict=True)]
        return "  ".join([first, *rest, cells[-1]]).rstrip()

    rule = "-" * len(line(tuple("-" * w for w in widths)))
    return "\n".join([title, line(header), rule, *(line(r) for r in rows)])


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _s(value: float) -> str:
    return f"{value:.3f}"


def _rate(value: float) -> str:
    return f"{value:.1f}"


def _bytes(n: int | None) -> str:
    return "-" if n is None else f"{n:,} B ({n / MiB:.2f} MiB)"


def throughput_rows(fig: Figures) -> Iterator[tuple[str, ...]]:
    size = fig.size_bytes
    yield (
        "local write 8 MiB + fsync",
        _s(fig.baseline_write_s),
        _rate(fig.baseline_write_mb_s),
        "",
        "",
    )
    yield (
        "local read 8 MiB",
        _s(fig.baseline_read_s),
        _rate(fig.baseline_read_mb_s),
        "",
        fig.baseline_read_cache,
    )
    yield (
        "vault ingest (PUT + commit)",
        _s(fig.ingest_s),
        _rate(fig.ingest_mb_s),
        f"{fig.ingest_vs_baseline_write:.2f}x write",
        f"{fig.chunks} chunks; hash = local BLAKE3: {fig.ingest_hash_matches_local}",
    )
    yield "  of which PUT", _s(fig.ingest_put_s), _rate(mb_per_s(size, fig.ingest_put_s)), "", ""
    yield "  of which commit", _s(fig.ingest_commit_s), "", "", ""
    yield (
        "vault download (GET)",
        _s(fig.download_s),
        _rate(fig.download_mb_s),
        f"{fig.download_vs_baseline_read:.2f}x read",
        f"BLAKE3 = PUT hash: {fig.download_hash_ok}; vault data {fig.vault_data_cache}",
    )
    if fig.dedup is not None:
        d = fig.dedup
        yield (
            "dedup ingest (1 MiB changed)",
            _s(d["ingest_s"]),
            _rate(d["ingest_mb_s"]),
            f"{d['ingest_mb_s'] / fig.baseline_write_mb_s:.2f}x write",
            f"hash = local BLAKE3: {d['hash_matches_local']}",
        )


MEMORY_ROWS = (
    ("server_idle", "server idle (after startup)"),
    ("server_ingest", "server during ingest"),
    ("server_download", "server during download"),
    ("server_dedup_ingest", "server during dedup ingest"),
    ("client_ingest", "client during ingest"),
    ("client_download", "client during download"),
)


def memory_rows(fig: Figures) -> Iterator[tuple[str, str, str, str]]:
    for key, label in MEMORY_ROWS:
        if key in fig.memory:
            m = fig.memory[key]
            yield label, _mib(m.vm_rss_mib), _mib(m.rss_anon_mib), "peak of 50 ms samples"
        if key == "server_ingest":
            hwm = fig.server_vmhwm_after_ingest_mib
            yield "server after ingest", _mib(hwm), "", "VmHWM (lifetime peak VmRSS)"
    yield "client whole run", _mib(fig.client_maxrss_mib), "", "getrusage ru_maxrss"


def storage_rows(fig: Figures) -> Iterator[tuple[str, str]]:
    yield "file size", _bytes(fig.size_bytes)
    yield "stored_bytes after first upload", _bytes(fig.stored_bytes_after_ingest)
    if fig.dedup is not None:
        d = fig.dedup
        yield "second version: changed bytes", _bytes(d["changed_bytes"])
        yield "second version: stored_bytes growth", _bytes(d["stored_bytes_growth"])
        yield "second version: new chunks", f"{d['chunks_growth']} of {d['chunks']}"
        yield "dedup_ratio (logical/stored)", str(d["dedup_ratio"])


def report(fig: Figures) -> str:
    title = (
        f"Checkpoint Vault ingest benchmark: {fig.size_bytes / MiB:.1f} MiB of random data "
        f"(seed {fig.seed}, {fig.generator}); MB = 10^6 bytes"
    )
    parts = [
        title,
        "",
        table(
            "Throughput",
            ("phase", "seconds", "MB/s", "ratio", "notes"),
            list(throughput_rows(fig)),
        ),
        "",
        table(
            "Peak resident memory (VmRSS includes mapped LMDB pages; RssAnon is heap/buffers)",
            ("process / phase", "VmRSS MiB", "RssAnon MiB", "how"),
            list(memory_rows(fig)),
        ),
        "",
        table("Storage", ("figure", "value"), list(storage_rows(fig))),
        "",
        f"server: healthy after {fig.server_startup_s:.2f} s; SIGTERM -> exit code "
        f"{fig.server_exit_code} after {fig.server_stop_s:.2f} s"
        + (" (killed: did not exit in time)" if fig.server_killed else ""),
        "ingest reads source.bin from the page cache (written just before); both run on one "
        "machine over loopback, so client and server share the CPUs.",
    ]
    parts.extend(f"note: {n}" for n in fig.notes)
    return "\n".join(parts)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench_ingest.py",
        description="Ingest/download throughput of a real Checkpoint Vault server vs local disk.",
    )
    p.add_argument(
        "--size",
        type=parse_size,
        default=GiB,
        help="bytes of random data, e.g. 1GiB (default), 256MiB",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (data, vault, log)")
    p.add_argument("--json", action="store_true", help="also print all figures as one JSON line")
    p.add_argument(
        "--dedup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also upload a second version with 1 MiB changed (default on)",
    )
    p.add_argument(
        "--tmpdir", type=Path, default=None, help="where to create the temp dir (default: $TMPDIR)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        fig = run(args)
    except BenchError as e:
        print(f"bench_ingest: {e}", file=sys.stderr)
        return 1
    print(report(fig))
    if args.json:
        print(json.dumps(asdict(fig), sort_keys=True))
    ok = fig.ingest_hash_matches_local and fig.download_hash_ok and fig.server_exit_code == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
