"""client.torch against a real server: throughput, background-save blocking, and which
chunking suits safetensors. Run by hand, never by the test suite (needs torch and
safetensors: see bench/series.py).

    python bench/bench_torch.py                               # every part
    python bench/bench_torch.py --part throughput,background --repeat 5
    python bench/bench_torch.py --part dedup --count 10 --json

Parts, each measured against a baseline in the same run:

- `throughput`: a ~198 MB state_dict (checkpoint 0 of the `lora` series of series.py,
  loaded into memory) through `save_state_dict` / `load_state_dict`, against `torch.save`
  to a local file + fsync and `torch.load` from it. Each repeat saves a fresh variant (every
  float tensor shifted by the repeat number, so every chunk is new to the vault), then
  the same state again (every chunk known), then checkpoint 1 of the series (what a
  training run sends: only adapters and optimizer state changed). MB/s counts the
  torch.save bytes.
- `background`: the time `save_state_dict(..., background=True)` blocks the caller (the
  CPU snapshot) and the time until its handle is done, against `torch.save` + fsync.
- `dedup`: the `lora` and `embedding` series, each checkpoint saved three ways, each way
  into its own fresh server (chunks would otherwise dedup across the ways): `torch.save`
  streamed (`save_state_dict`), safetensors with plain FastCDC over the file
  (`cut_at_tensors=False`), and safetensors with a chunk boundary at every tensor
  (`cut_at_tensors=True`). Reports the vault's stored-bytes growth and the bytes sent.

Figures use MB = 10^6 bytes. Client and server share the machine's cores over loopback.
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
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from bench_client import wait_healthy
from bench_ingest import Server, log, mb_per_s, table
from series import embedding, lora

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.torch import load_state_dict, save_safetensors, save_state_dict

MB = 1_000_000
PARTS = ("throughput", "background", "dedup")
WAYS = ("torch.save + CDC", "safetensors + CDC", "safetensors, cut at tensors")


# -- helpers --------------------------------------------------------------------------------
class Vault:
    """A fresh server in its own data dir and a client for it."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True)
        self.server = Server(data_dir=root / "data", log_path=root / "server.log")
        self.server.start()
        wait_healthy(self.server)
        self.client = VaultClient(self.server.url, self.server.token(), progress=False)

    def stored(self) -> int:
        return self.client.stats().stored_bytes

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            self.server.stop()


def shifted(state: Any, by: float) -> Any:
    """The same structure with every float tensor moved by `by` (new bytes, same sizes)."""
    if isinstance(state, torch.Tensor):
        return state + by if state.is_floating_point() else state.clone()
    if isinstance(state, dict):
        return {k: shifted(v, by) for k, v in state.items()}
    if isinstance(state, list):
        return [shifted(v, by) for v in state]
    return state


def flatten(state: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """The tensors of a nested state as safetensors names them ("model.blocks.0.q...")."""
    if isinstance(state, torch.Tensor):
        return {prefix: state}
    out: dict[str, torch.Tensor] = {}
    items = (
        state.items()
        if isinstance(state, dict)
        else enumerate(state)
        if isinstance(state, (list, tuple))
        else ()
    )
    for k, v in items:
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def save_local(state: Any, path: Path) -> float:
    """torch.save to a file + fsync: seconds."""
    start = time.perf_counter()
    with path.open("wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - start


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    return bool(a == b)


def lora_states(work: Path, count: int) -> Iterator[Any]:
    """The lora series' checkpoints as in-memory states (each file removed once loaded)."""
    for ckpt in lora(work, seed=0, count=count):
        path = Path(ckpt["model.pt"])
        yield torch.load(path, weights_only=True)
        path.unlink()


# -- throughput and background ----------------------------------------------------------
@dataclass
class Throughput:
    state_bytes: int = 0
    local_save_s: list[float] = field(default_factory=list)
    local_load_s: list[float] = field(default_factory=list)
    vault_save_new_s: list[float] = field(default_factory=list)
    vault_save_same_s: list[float] = field(default_factory=list)
    vault_save_next_s: list[float] = field(default_factory=list)
    vault_load_s: list[float] = field(default_factory=list)
    sent_new: int = 0
    sent_next: int = 0
    loads_identical: bool = True
    bg_block_s: list[float] = field(default_factory=list)
    bg_done_s: list[float] = field(default_factory=list)
    bg_local_save_s: list[float] = field(default_factory=list)


def run_throughput(fig: Throughput, tmp: Path, repeat: int, parts: set[str]) -> None:
    states = lora_states(tmp / "series", 2)
    base, following = next(states), next(states)
    vault = Vault(tmp / "vault-throughput")
    try:
        client = vault.client
        local = tmp / "local.pt"
        save_state_dict(client, "tp/warm-up", shifted(base, 0.5))  # LMDB grows its map here
        for r in range(repeat):
            state = shifted(base, float(r + 1))
            fig.local_save_s.append(save_local(state, local))
            fig.state_bytes = local.stat().st_size
            load_s, _ = timed(lambda: torch.load(local, weights_only=True))
            fig.local_load_s.append(load_s)
            if "throughput" in parts:
                measure_vault(fig, client, state, following, r)
            if "background" in parts:
                measure_background(fig, client, state, local, r)
            log(f"repeat {r + 1}/{repeat} done")
    finally:
        vault.close()


def measure_vault(fig: Throughput, client: VaultClient, state: Any, following: Any, r: int) -> None:
    """`state` is checkpoint 0 shifted by r + 1: new to the vault; `following` checkpoint
    1 shifted alike, so it shares checkpoint 0's frozen base as in the series."""
    ns = f"tp/{r}"
    sent = client.transfer.bytes_sent
    seconds, ckpt = timed(lambda: save_state_dict(client, ns, state))
    fig.vault_save_new_s.append(seconds)
    fig.sent_new = client.transfer.bytes_sent - sent
    seconds, _ = timed(lambda: save_state_dict(client, ns, state))
    fig.vault_save_same_s.append(seconds)
    load_s, loaded = timed(lambda: load_state_dict(client, ns, ckpt.id))
    fig.vault_load_s.append(load_s)
    fig.loads_identical = fig.loads_identical and same(loaded, state)
    del loaded
    nxt = shifted(following, float(r + 1))
    sent = client.transfer.bytes_sent
    seconds, _ = timed(lambda: save_state_dict(client, ns, nxt, parent=ckpt.id))
    fig.vault_save_next_s.append(seconds)
    fig.sent_next = client.transfer.bytes_sent - sent


def measure_background(
    fig: Throughput, client: VaultClient, state: Any, local: Path, r: int
) -> None:
    fig.bg_local_save_s.append(save_local(state, local))
    start = time.perf_counter()
    handle = save_state_dict(client, f"bg/{r}", state, background=True)
    fig.bg_block_s.append(time.perf_counter() - start)
    handle.result()
    fig.bg_done_s.append(time.perf_counter() - start)


# -- dedup ----------------------------------------------------------------------------------
@dataclass
class WayFigures:
    way: str
    logical_bytes: list[int] = field(default_factory=list)
    stored_growth: list[int] = field(default_factory=list)
    bytes_sent: list[int] = field(default_factory=list)
    chunks: list[int] = field(default_factory=list)
    save_s: list[float] = field(default_factory=list)


def save_way(way: str, client: VaultClient, ns: str, state: Any, tensors: dict[str, Any]) -> Any:
    if way == WAYS[0]:
        return save_state_dict(client, ns, state)
    cut = way == WAYS[2]
    return save_safetensors(client, ns, tensors, cut_at_tensors=cut)


def run_dedup(series: str, tmp: Path, count: int) -> list[WayFigures]:
    vaults = [Vault(tmp / f"vault-{series}-{i}") for i in range(len(WAYS))]
    figs = [WayFigures(way) for way in WAYS]
    try:
        if series == "lora":
            states: Iterator[Any] = lora_states(tmp / f"series-{series}", count)
        else:
            states = embedding_states(tmp / f"series-{series}", count)
        for i, state in enumerate(states):
            tensors = {k: v.contiguous() for k, v in flatten(state).items()}
            for vault, fig in zip(vaults, figs, strict=True):
                measure_way(vault, fig, f"dd/{series}", state, tensors)
            log(f"{series}: checkpoint {i} saved three ways")
    finally:
        for vault in vaults:
            vault.close()
    return figs


def measure_way(
    vault: Vault, fig: WayFigures, ns: str, state: Any, tensors: dict[str, Any]
) -> None:
    stored, sent = vault.stored(), vault.client.transfer.bytes_sent
    start = time.perf_counter()
    ckpt = save_way(fig.way, vault.client, ns, state, tensors)
    fig.save_s.append(time.perf_counter() - start)
    name = next(iter(ckpt.files))
    fig.logical_bytes.append(ckpt.files[name].size)
    fig.stored_growth.append(vault.stored() - stored)
    fig.bytes_sent.append(vault.client.transfer.bytes_sent - sent)
    fig.chunks.append(len(vault.client.manifest(ns, ckpt.id).files[name].chunks))


def embedding_states(work: Path, count: int) -> Iterator[Any]:
    for ckpt in embedding(work, seed=0, count=count):
        path = Path(ckpt["table.pt"])
        yield torch.load(path, weights_only=True)
        path.unlink()


# -- report ---------------------------------------------------------------------------------
def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def throughput_rows(f: Throughput) -> list[tuple[str, str, str]]:
    n = f.state_bytes
    local_save, local_load = med(f.local_save_s), med(f.local_load_s)
    rows = [
        (
            "torch.save to a local file + fsync",
            f"{local_save:.3f} s",
            f"{mb_per_s(n, local_save):.0f} MB/s",
        ),
        ("torch.load from that file", f"{local_load:.3f} s", f"{mb_per_s(n, local_load):.0f} MB/s"),
    ]
    for label, values, base in (
        ("save_state_dict, every chunk new", f.vault_save_new_s, local_save),
        ("save_state_dict, same state again", f.vault_save_same_s, local_save),
        ("save_state_dict, next lora checkpoint", f.vault_save_next_s, local_save),
        ("load_state_dict (range reads)", f.vault_load_s, local_load),
    ):
        if values:
            s = med(values)
            rows.append((label, f"{s:.3f} s", f"{mb_per_s(n, s):.0f} MB/s = {base / s:.2f}x local"))
    if f.vault_save_new_s:
        rows.append(
            (
                "bytes sent: new / next checkpoint",
                f"{f.sent_new / MB:.1f} MB",
                f"{f.sent_next / MB:.1f} MB",
            )
        )
        rows.append(("loaded state identical", str(f.loads_identical), ""))
    return rows


def background_rows(f: Throughput) -> list[tuple[str, str, str]]:
    local = med(f.bg_local_save_s)
    block, done = med(f.bg_block_s), med(f.bg_done_s)
    return [
        ("torch.save + fsync (caller blocked)", f"{local * 1000:.0f} ms", "1.00x"),
        ("background=True: caller blocked", f"{block * 1000:.0f} ms", f"{block / local:.2f}x"),
        ("background=True: until done", f"{done * 1000:.0f} ms", f"{done / local:.2f}x"),
    ]


def dedup_rows(figs: list[WayFigures]) -> list[tuple[str, ...]]:
    rows = []
    for f in figs:
        later = f.stored_growth[1:]
        logical = sum(f.logical_bytes)
        stored = sum(f.stored_growth)
        rows.append(
            (
                f.way,
                f"{logical / MB:.1f}",
                f"{stored / MB:.1f}",
                f"{logical / stored:.2f}x" if stored else "-",
                f"{statistics.mean(later) / MB:.2f}" if later else "-",
                f"{statistics.mean(f.bytes_sent[1:]) / MB:.2f}" if later else "-",
                f"{statistics.mean(f.chunks):.0f}",
                f"{med(f.save_s):.2f}",
            )
        )
    return rows


def report(results: dict[str, Any], repeat: int) -> str:
    parts = ["client.torch benchmark (MB = 10^6 bytes; medians of the repeats)"]
    tp: Throughput | None = results.get("throughput")
    if tp and tp.vault_save_new_s:
        parts += [
            "",
            table(
                f"torch state_dict of {tp.state_bytes / MB:.1f} MB, {repeat} repeats",
                ("what", "time", "rate"),
                throughput_rows(tp),
            ),
        ]
    if tp and tp.bg_block_s:
        parts += [
            "",
            table(
                "background save: how long the training step waits",
                ("what", "time", "vs torch.save"),
                background_rows(tp),
            ),
        ]
    for series in ("lora", "embedding"):
        if series in results:
            header = (
                "way",
                "logical MB",
                "stored MB",
                "dedup",
                "stored/ckpt after 1st MB",
                "sent/ckpt MB",
                "chunks/ckpt",
                "save s",
            )
            parts += [
                "",
                table(f"dedup over the {series} series", header, dedup_rows(results[series])),
            ]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_torch.py", description=__doc__.splitlines()[0])
    p.add_argument("--part", default=",".join(PARTS), help=f"comma-separated of {','.join(PARTS)}")
    p.add_argument("--repeat", type=int, default=3, help="throughput/background repeats (3)")
    p.add_argument("--count", type=int, default=10, help="checkpoints per dedup series (10)")
    p.add_argument("--json", action="store_true", help="also print every figure as JSON")
    p.add_argument("--tmpdir", type=Path, default=None, help="where to make the temp dir")
    args = p.parse_args(argv)
    parts = {s.strip() for s in args.part.split(",") if s.strip()}
    if not parts <= set(PARTS):
        p.error(f"unknown part(s) {sorted(parts - set(PARTS))}")
    tmp = Path(tempfile.mkdtemp(prefix="ckpt-bench-torch-", dir=args.tmpdir))
    results: dict[str, Any] = {}
    try:
        if parts & {"throughput", "background"}:
            results["throughput"] = Throughput()
            run_throughput(results["throughput"], tmp, args.repeat, parts)
        if "dedup" in parts:
            for series in ("lora", "embedding"):
                results[series] = run_dedup(series, tmp, args.count)
    finally:  # report what was measured, even when a later part failed
        shutil.rmtree(tmp, ignore_errors=True)
        print(report(results, args.repeat))
    if args.json:
        print(
            json.dumps(
                {
                    k: asdict(v) if isinstance(v, Throughput) else [asdict(w) for w in v]
                    for k, v in results.items()
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
