"""Which library should do byte-grouped compression and parent deltas of tensors: a probe.

Run by hand, never by the test suite. Needs torch, safetensors, numpy, zstandard, and for
the probe itself `pip install blosc2 numcodecs`:

    python bench/codec_probe.py                                  # finetune, embedding, bf16
    python bench/codec_probe.py --series bf16 --pieces tensor --json

Why: the issue "Tensor-aware storage: byte-grouped compression and deltas against the
parent" needs a codec. Float tensors compress poorly with plain zstd because the high
(sign/exponent) bytes, which repeat, are interleaved with the near-random low mantissa
bytes. Grouping byte k of every element together ("shuffle", element width 4 for fp32, 2
for bf16) lets zstd see the repetitive planes; XOR against the same tensor of the parent
checkpoint first turns unchanged and slightly changed elements into zeros and small values.

What it does: generates two consecutive checkpoints (ckpt-000 and ckpt-001) of each series
with bench/series.py in a child process, loads the tensors of ckpt-001 and of its parent
(`train.pt` / `table.pt` with torch.load, `model.safetensors` with safetensors; the
safetensors weights repeat train.pt's, so only the .pt is probed when both exist), views
each as raw uint8, and for every tensor that has a same-size tensor under the same key in
the parent, encodes and decodes it with each method below, on one core, at three
granularities: the whole tensor, and 1 MiB and 64 KiB pieces (the vault's chunk sizes).
Every decode is compared byte for byte with the input; any mismatch fails the run.

Methods (zstd level 1 unless the name says 3):
  zstd1, zstd3          python-zstandard on the raw bytes
  blosc2-shuf           python-blosc2, SHUFFLE filter (typesize = element width) + ZSTD codec
  numcodecs-shuf        numcodecs Shuffle(elementsize) then Zstd
  numpy-shuf            numpy reshape(-1, w).T copy, then python-zstandard
  xor-zstd1             XOR with the parent's tensor, then zstandard (no grouping)
  xor-blosc2 / xor-numcodecs / xor-numpy   XOR with the parent, then the grouping above

MB/s is input bytes (10^6) per second of encode or decode alone, single thread (blosc2 is
set to 1 thread). The machine is a shared 2-core box: take ratios within a run.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

MB = 1_000_000
KiB = 1 << 10
MiB = 1 << 20
SERIES_SCRIPT = Path(__file__).with_name("series.py")
ALL_SERIES = ("finetune", "embedding", "bf16")
PIECES = {"tensor": 0, "1MiB": MiB, "64KiB": 64 * KiB}
GENERATE_TIMEOUT_S = 900.0

Array = Any  # numpy uint8 array; numpy's generics are not worth spelling here
Encoder = Callable[[Array, Array | None, int], bytes]
Decoder = Callable[[bytes, Array | None, int], Array]


class ProbeError(RuntimeError):
    """The probe cannot go on, or a decode was not byte-identical."""


def log(message: str) -> None:
    print(f"[probe] {message}", file=sys.stderr, flush=True)


# -- the codecs ----------------------------------------------------------------------------

_ZC1 = zstandard.ZstdCompressor(level=1)
_ZC3 = zstandard.ZstdCompressor(level=3)
_ZD = zstandard.ZstdDecompressor()


def _u8(data: bytes | bytearray | memoryview | Array) -> Array:
    return np.frombuffer(data, dtype=np.uint8)


def _group(raw: Array, width: int) -> Array:
    """Byte k of every element together: (n, w) -> (w, n), contiguous."""
    return np.ascontiguousarray(raw.reshape(-1, width).T)


def _ungroup(grouped: Array, width: int) -> Array:
    return np.ascontiguousarray(grouped.reshape(width, -1).T).reshape(-1)


def _xor(raw: Array, parent: Array | None) -> Array:
    if parent is None:
        raise ProbeError("XOR method without a parent")
    return np.bitwise_xor(raw, parent)


def _blosc2_enc(raw: Array, width: int) -> bytes:
    import blosc2

    out: bytes = blosc2.compress2(
        raw.tobytes(),
        typesize=width,
        clevel=1,
        codec=blosc2.Codec.ZSTD,
        filters=[blosc2.Filter.SHUFFLE],
        nthreads=1,
    )
    return out


def _blosc2_dec(blob: bytes) -> Array:
    import blosc2

    return _u8(blosc2.decompress2(blob, nthreads=1))


def _numcodecs_pair(width: int) -> tuple[Any, Any]:
    from numcodecs import Shuffle, Zstd

    return Shuffle(elementsize=width), Zstd(level=1)


def _numcodecs_enc(raw: Array, width: int) -> bytes:
    shuffle, zstd = _numcodecs_pair(width)
    return bytes(zstd.encode(shuffle.encode(raw)))


def _numcodecs_dec(blob: bytes, width: int) -> Array:
    shuffle, zstd = _numcodecs_pair(width)
    return _u8(shuffle.decode(zstd.decode(blob)))


def _numpy_enc(raw: Array, width: int) -> bytes:
    return _ZC1.compress(_group(raw, width).data)


def _numpy_dec(blob: bytes, width: int) -> Array:
    return _ungroup(_u8(_ZD.decompress(blob)), width)


def _xor_enc(inner: Callable[[Array, int], bytes]) -> Encoder:
    return lambda raw, parent, width: inner(_xor(raw, parent), width)


def _xor_dec(inner: Callable[[bytes, int], Array]) -> Decoder:
    return lambda blob, parent, width: _xor(inner(blob, width), parent)


@dataclass(frozen=True)
class Method:
    name: str
    library: str  # the distribution whose health we check
    uses_parent: bool
    encode: Encoder
    decode: Decoder


METHODS: tuple[Method, ...] = (
    Method(
        "zstd1",
        "zstandard",
        False,
        lambda r, p, w: _ZC1.compress(r.data),
        lambda b, p, w: _u8(_ZD.decompress(b)),
    ),
    Method(
        "zstd3",
        "zstandard",
        False,
        lambda r, p, w: _ZC3.compress(r.data),
        lambda b, p, w: _u8(_ZD.decompress(b)),
    ),
    Method(
        "blosc2-shuf",
        "blosc2",
        False,
        lambda r, p, w: _blosc2_enc(r, w),
        lambda b, p, w: _blosc2_dec(b),
    ),
    Method(
        "numcodecs-shuf",
        "numcodecs",
        False,
        lambda r, p, w: _numcodecs_enc(r, w),
        lambda b, p, w: _numcodecs_dec(b, w),
    ),
    Method(
        "numpy-shuf",
        "numpy",
        False,
        lambda r, p, w: _numpy_enc(r, w),
        lambda b, p, w: _numpy_dec(b, w),
    ),
    Method(
        "xor-zstd1",
        "zstandard",
        True,
        lambda r, p, w: _ZC1.compress(_xor(r, p).data),
        lambda b, p, w: _xor(_u8(_ZD.decompress(b)), p),
    ),
    Method(
        "xor-blosc2", "blosc2", True, _xor_enc(_blosc2_enc), _xor_dec(lambda b, w: _blosc2_dec(b))
    ),
    Method("xor-numcodecs", "numcodecs", True, _xor_enc(_numcodecs_enc), _xor_dec(_numcodecs_dec)),
    Method("xor-numpy", "numpy", True, _xor_enc(_numpy_enc), _xor_dec(_numpy_dec)),
)


# -- tensors -------------------------------------------------------------------------------


@dataclass
class Tensor:
    key: str
    width: int  # element size in bytes
    raw: Array  # uint8 view of the bytes


def _walk(obj: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    import torch

    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, f"{prefix}/{k}")
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield from _walk(v, f"{prefix}/{i}")


def load_tensors(path: Path) -> dict[str, Tensor]:
    """Every tensor in a torch.save or safetensors file, by key path, as raw bytes."""
    import torch

    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        found: Iterator[tuple[str, Any]] = iter(load_file(str(path)).items())
    else:
        found = _walk(torch.load(path, map_location="cpu", weights_only=True), "")
    out: dict[str, Tensor] = {}
    for key, t in found:
        flat = t.detach().contiguous().reshape(-1)
        if flat.numel() == 0:
            continue
        raw = flat.view(torch.uint8).numpy().copy()
        out[key] = Tensor(key, int(flat.element_size()), raw)
    return out


def probe_file(ckpt: Path, parent: Path) -> Path:
    """The file of a checkpoint to probe: the .pt when there is one (safetensors repeats it)."""
    names = sorted(p.name for p in ckpt.iterdir())
    pts = [n for n in names if n.endswith(".pt")]
    name = pts[0] if pts else names[0]
    if not (parent / name).is_file():
        raise ProbeError(f"{name} missing from the parent {parent}")
    return ckpt / name


# -- measuring -----------------------------------------------------------------------------


@dataclass
class Tally:
    series: str
    pieces: str
    method: str
    input_bytes: int = 0
    output_bytes: int = 0
    encode_s: float = 0.0
    decode_s: float = 0.0
    identical: bool = True

    @property
    def ratio(self) -> float:
        return self.input_bytes / self.output_bytes if self.output_bytes else 0.0

    def mb_s(self, seconds: float) -> float:
        return self.input_bytes / MB / seconds if seconds > 0 else float("inf")


def split(raw: Array, piece: int) -> Iterator[tuple[int, Array]]:
    if piece <= 0 or raw.size <= piece:
        yield 0, raw
        return
    for start in range(0, raw.size, piece):
        yield start, raw[start : start + piece]


def measure(tally: Tally, method: Method, cur: Tensor, parent: Tensor, piece: int) -> None:
    """Encode and decode one tensor (in pieces), timing each and checking the decode."""
    if cur.raw.size % cur.width or piece % cur.width:
        raise ProbeError(f"{cur.key}: {cur.raw.size} bytes is not whole {cur.width}-byte elements")
    for start, raw in split(cur.raw, piece):
        prev = parent.raw[start : start + raw.size] if method.uses_parent else None
        t0 = time.perf_counter()
        blob = method.encode(raw, prev, cur.width)
        t1 = time.perf_counter()
        back = method.decode(blob, prev, cur.width)
        t2 = time.perf_counter()
        tally.encode_s += t1 - t0
        tally.decode_s += t2 - t1
        tally.input_bytes += raw.size
        tally.output_bytes += len(blob)
        if back.size != raw.size or not np.array_equal(back, raw):
            tally.identical = False
            raise ProbeError(f"{tally.method}: decode of {cur.key}@{start} differs")


@dataclass
class SeriesProbe:
    series: str
    file: str
    tensors: int
    paired_bytes: int
    unpaired_bytes: int
    changed_fraction: float  # of paired bytes that differ from the parent
    tallies: list[Tally] = field(default_factory=list)


def probe_series(name: str, work: Path, seed: int, pieces: list[str]) -> SeriesProbe:
    out = work / name
    cmd = [sys.executable, str(SERIES_SCRIPT), name, "--out", str(out), "--seed", str(seed)]
    cmd += ["--count", "2", "--json"]
    log(f"generating {name}: {' '.join(cmd[1:])}")
    done = subprocess.run(
        cmd, stdout=subprocess.PIPE, check=False, timeout=GENERATE_TIMEOUT_S, text=True
    )
    if done.returncode != 0:
        raise ProbeError(f"series.py {name} exited {done.returncode}")
    path = probe_file(out / "ckpt-001", out / "ckpt-000")
    cur, par = load_tensors(path), load_tensors(out / "ckpt-000" / path.name)
    pairs = [(t, par[k]) for k, t in cur.items() if k in par and par[k].raw.size == t.raw.size]
    paired = sum(t.raw.size for t, _ in pairs)
    changed = sum(int(np.count_nonzero(t.raw != p.raw)) for t, p in pairs)
    result = SeriesProbe(
        name,
        path.name,
        len(cur),
        paired,
        sum(t.raw.size for t in cur.values()) - paired,
        changed / paired if paired else 0.0,
    )
    log(f"{name}: {path.name}, {len(pairs)} paired tensors, {paired / MB:.1f} MB")
    for label in pieces:
        for method in METHODS:
            tally = Tally(name, label, method.name)
            for t, p in pairs:
                measure(tally, method, t, p, PIECES[label])
            result.tallies.append(tally)
            log(f"{name} {label:6} {method.name:15} ratio {tally.ratio:.3f}")
    return result


# -- library health ------------------------------------------------------------------------


def health(dist: str) -> dict[str, Any]:
    """Version and declared requirements (what `pip show` prints), and whether its wheel
    bundles native libraries (auditwheel's `<name>.libs` dir) or links any outside the
    manylinux base set."""
    try:
        meta = importlib.metadata.metadata(dist)
        requires = importlib.metadata.requires(dist) or []
    except importlib.metadata.PackageNotFoundError:
        return {"dist": dist, "version": None}
    hard = sorted(
        {
            r.split(";")[0].split()[0].split(">")[0].split("=")[0]
            for r in requires
            if "extra ==" not in r
        }
    )
    files = importlib.metadata.files(dist) or []
    natives = [str(f) for f in files if str(f).endswith(".so") or ".so." in str(f)]
    bundled = sorted({str(f).split("/")[0] for f in files if ".libs/" in str(f)})
    return {
        "dist": dist,
        "version": meta["Version"],
        "requires": hard,
        "native_modules": len(natives),
        "bundled_lib_dirs": bundled,
    }


# -- output --------------------------------------------------------------------------------


def table(title: str, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([title, line(header), "-" * len(line(header)), *(line(r) for r in rows)])


def report(probes: list[SeriesProbe]) -> str:
    parts = []
    for sp in probes:
        rows: list[tuple[str, ...]] = [
            (
                t.pieces,
                t.method,
                f"{t.ratio:.3f}",
                f"{t.mb_s(t.encode_s):.0f}",
                f"{t.mb_s(t.decode_s):.0f}",
                "yes" if t.identical else "NO",
            )
            for t in sp.tallies
        ]
        title = (
            f"{sp.series}: {sp.file}, ckpt-001 against ckpt-000; {sp.paired_bytes / MB:.1f} MB "
            f"in {sp.tensors} tensors ({sp.unpaired_bytes} bytes without a parent tensor); "
            f"{sp.changed_fraction:.1%} of bytes differ from the parent"
        )
        header = ("pieces", "method", "ratio", "enc MB/s", "dec MB/s", "identical")
        parts += [table(title, header, rows), ""]
    return "\n".join(parts)


GROUPING = ("blosc2", "numcodecs", "numpy")


def recommend(probes: list[SeriesProbe], libs: dict[str, dict[str, Any]]) -> str:
    """One line: the grouping library to use, from ratio, speed (64 KiB and 1 MiB pieces,
    XOR variants, all series) and health."""
    score: dict[str, list[float]] = {lib: [0.0, 0.0, 0.0, 0.0] for lib in GROUPING}
    for sp in probes:
        for t in sp.tallies:
            lib = t.method.removeprefix("xor-").removesuffix("-shuf")
            if lib in score and t.pieces != "tensor":
                s = score[lib]
                s[0] += t.input_bytes
                s[1] += t.output_bytes
                s[2] += t.encode_s
                s[3] += t.decode_s
    figures = {
        lib: (s[0] / s[1], s[0] / MB / s[2], s[0] / MB / s[3]) for lib, s in score.items() if s[1]
    }
    best_ratio = max(r for r, _, _ in figures.values())
    # Within 2% of the best ratio, prefer the fewest new dependencies, then encode speed.
    deps = {lib: len(libs.get(lib, {}).get("requires", [])) for lib in GROUPING}
    deps["numpy"] = -1  # numpy + zstandard: already installed with the vault's torch extra
    close = [lib for lib, (r, _, _) in figures.items() if r >= best_ratio * 0.98]
    pick = min(close, key=lambda lib: (deps[lib], -figures[lib][1]))
    desc = "; ".join(
        f"{lib} {r:.3f}x, enc {e:.0f} / dec {d:.0f} MB/s, {libs.get(lib, {}).get('version')}, "
        f"requires {libs.get(lib, {}).get('requires')}"
        for lib, (r, e, d) in figures.items()
    )
    return (
        f"recommendation: byte grouping via {pick} "
        f"(chunk-sized pieces, plain + XOR, all series: {desc})"
    )


def parse_list(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [s.strip() for s in text.split(",") if s.strip()]
        bad = [n for n in names if n not in choices]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {','.join(choices)}")
        return list(dict.fromkeys(names))

    return parse


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="codec_probe.py", description=__doc__.splitlines()[0])
    p.add_argument("--series", type=parse_list(ALL_SERIES), default=list(ALL_SERIES))
    p.add_argument("--pieces", type=parse_list(tuple(PIECES)), default=list(PIECES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="also print one JSON object")
    p.add_argument("--keep", action="store_true", help="keep the temp dir")
    p.add_argument("--tmpdir", type=Path, default=None, help="where to create the temp dir")
    args = p.parse_args(argv)
    import blosc2

    blosc2.set_nthreads(1)
    tmp = Path(tempfile.mkdtemp(prefix="ckpt-codec-probe-", dir=args.tmpdir))
    probes: list[SeriesProbe] = []
    error = None
    try:
        for name in args.series:
            probes.append(probe_series(name, tmp, args.seed, args.pieces))
            if not args.keep:
                shutil.rmtree(tmp / name, ignore_errors=True)
    except ProbeError as e:
        error = str(e)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    libs = {d: health(d) for d in ("zstandard", "blosc2", "numcodecs", "numpy")}
    print(report(probes))
    for lib in libs.values():
        print(f"library {lib}")
    if probes:
        print(recommend(probes, libs))
    if error:
        print(f"ERROR: {error}")
    if args.json:
        out = {"probes": [asdict(sp) for sp in probes], "libraries": libs, "error": error}
        print(json.dumps(out, sort_keys=True))
    return 1 if error else 0


if __name__ == "__main__":
    sys.exit(main())
