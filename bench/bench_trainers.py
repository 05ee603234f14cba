"""The training-loop integrations against a real server: what background vault saves add
to a step, against the local-disk saves of the same run, and what the run's checkpoints
take on the server's disk. Run by hand, never by the test suite (needs the `hf` and
`lightning` extras).

    python bench/bench_trainers.py                       # both parts
    python bench/bench_trainers.py --part hf --steps 60 --save-every 5 --json

Parts, each in one process, with a fresh server per part (so its data dir holds that run
alone), the same seeds and the same data for every run of the part:

- `hf`: a GPT-2 built from its config (4 layers, width 256, vocabulary 4096: 4.3M
  parameters; a checkpoint directory holds model.safetensors, optimizer.pt (Adam's two
  moments), scheduler, RNG state and trainer_state.json, about 51 MB) trained `--steps`
  steps three ways: no saves; the Trainer's own saves to local disk every `--save-every`
  steps (safetensors and `torch.save`); and the same with `VaultCallback` pushing each
  directory in the background.
- `lightning`: an MLP (4 x 1024 wide, 4.2M parameters, Adam; about 50 MB per
  checkpoint) trained `--steps` steps three ways: no checkpointing; ModelCheckpoint every
  `--save-every` steps to local disk (Lightning's TorchCheckpointIO: `torch.save`); and
  the same ModelCheckpoint through `VaultCheckpointIO` (background upload, nothing local).

Step time is the interval between the starts of successive steps (the save at a step's end
counts in that step), averaged over every step but the first; the end-of-training wait
for uploads in flight is reported apart. On disk: the server's data dir, allocated bytes
(st_blocks x 512 summed, as `du -sb` would count them) grown over the run, against the
checkpoints' file bytes (their logical size), beside the engine's `stored_bytes`.
Figures use MB = 10^6 bytes. Client, server and training share the machine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"  # a config-built model: nothing to download

import torch
from bench_client import wait_healthy
from bench_ingest import Server, log, table

from checkpoint_vault.client import VaultClient

MB = 1_000_000
PARTS = ("hf", "lightning")


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of this process (its threads included), or of `pid`."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def allocated(root: Path) -> int:
    """Bytes allocated under `root` (st_blocks x 512), as `du -sb` counts them."""
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


@contextmanager
def fresh_vault(root: Path) -> Iterator[tuple[VaultClient, Path, int]]:
    """A server in its own data dir under `root`, a client for it, the server's pid."""
    root.mkdir(parents=True)
    server = Server(data_dir=root / "data", log_path=root / "server.log")
    server.start()
    try:
        wait_healthy(server)
        with VaultClient(server.url, server.token(), progress=False) as client:
            yield client, root / "data", server.pid
    finally:
        server.stop()


class StepClock:
    """Start times of each step; `mean_ms` averages the intervals after the first.
    `blocked`: how long each save held the loop in the vault's code (HF: VaultCallback's
    on_save, which reads the checkpoint directory)."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.end = 0.0
        self.save_began = 0.0
        self.blocked: list[float] = []

    def result(self, name: str, total: float, cpu: float) -> dict[str, Any]:
        blocked = 1000 * statistics.fmean(self.blocked) if self.blocked else 0.0
        return {
            "run": name,
            "step_ms": self.mean_ms(),
            "blocked_ms": blocked,
            "total_s": total,
            "cpu_s": cpu,
            "server_cpu_s": 0.0,
        }

    def tick(self) -> None:
        self.starts.append(time.perf_counter())

    def mean_ms(self) -> float:
        bounds = [*self.starts, self.end]
        gaps = [b - a for a, b in zip(bounds[1:-1], bounds[2:], strict=True)]
        return 1000 * statistics.fmean(gaps)


def storage_row(vault: VaultClient, namespace: str, data: Path, before: int) -> dict[str, Any]:
    """What the run's checkpoints take: logical bytes, the engine's stored bytes and the
    data dir's allocated growth."""
    live = vault.list(namespace, limit=1000)
    logical = sum(c.size for c in live)
    grown = allocated(data) - before
    stored = vault.stats().stored_bytes
    return {
        "checkpoints": len(live),
        "logical_mb": logical / MB,
        "stored_mb": stored / MB,
        "disk_mb": grown / MB,
        "disk_ratio": grown / logical,
        "stored_ratio": stored / logical,
    }


# -- Hugging Face ---------------------------------------------------------------------------
def hf_part(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from checkpoint_vault.client.hf import VaultCallback

    class Clock(TrainerCallback):
        """First callback: step starts, and when each save's callbacks begin."""

        def __init__(self) -> None:
            self.clock = StepClock()

        def on_step_begin(self, *a: Any, **kw: Any) -> None:
            self.clock.tick()

        def on_save(self, *a: Any, **kw: Any) -> None:
            self.clock.save_began = time.perf_counter()

        def on_train_end(self, *a: Any, **kw: Any) -> None:
            self.clock.end = time.perf_counter()

    class AfterSave(TrainerCallback):
        """Last callback: the callbacks between (VaultCallback's read) blocked this long."""

        def __init__(self, clock: StepClock) -> None:
            self.clock = clock

        def on_save(self, *a: Any, **kw: Any) -> None:
            self.clock.blocked.append(time.perf_counter() - self.clock.save_began)

    ids = torch.randint(0, 4096, (args.steps * 8, 64), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": row} for row in ids]

    def run(name: str, save: bool, vault: VaultClient | None = None) -> dict[str, Any]:
        torch.manual_seed(0)
        model = GPT2LMHeadModel(
            GPT2Config(n_layer=4, n_head=4, n_embd=256, vocab_size=4096, n_positions=128)
        )
        clock = Clock()
        pushing = [] if vault is None else [VaultCallback(vault, "bench/hf")]
        callbacks = [clock, *pushing, AfterSave(clock.clock)]
        training = TrainingArguments(
            output_dir=str(root / name),
            max_steps=args.steps,
            save_strategy="steps" if save else "no",
            save_steps=args.save_every,
            per_device_train_batch_size=8,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            seed=0,
        )
        trainer = Trainer(model, training, train_dataset=data, callbacks=callbacks)
        t0, cpu = time.perf_counter(), cpu_seconds()
        trainer.train()  # VaultCallback's on_train_end waits for its uploads
        return clock.clock.result(name, time.perf_counter() - t0, cpu_seconds() - cpu)

    return repeated(
        args,
        root,
        "hf",
        lambda: run("warm-up", False),
        {"no saves": lambda: run("no saves", False), "local saves": lambda: run("local", True)},
        ("local + vault", lambda vault: run("local + vault", True, vault)),
    )


# -- Lightning ------------------------------------------------------------------------------
def lightning_part(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint

    from checkpoint_vault.client.lightning import VaultCheckpointIO

    class MLP(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            layers = [torch.nn.Linear(1024, 1024) for _ in range(4)]
            self.net = torch.nn.Sequential(*layers)

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-4)

    class Clock(pl.Callback):
        def __init__(self) -> None:
            self.clock = StepClock()

        def on_train_batch_start(self, *a: Any, **kw: Any) -> None:
            self.clock.tick()

        def on_train_end(self, *a: Any, **kw: Any) -> None:
            self.clock.end = time.perf_counter()

    x = torch.randn(args.steps * 16, 1024, generator=torch.Generator().manual_seed(1))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x), batch_size=16)

    def run(name: str, checkpoints: bool, vault: VaultClient | None = None) -> dict[str, Any]:
        torch.manual_seed(0)
        clock = Clock()
        callbacks: list[pl.Callback] = [clock]
        if checkpoints:
            every = ModelCheckpoint(
                dirpath=root / name, every_n_train_steps=args.save_every, save_top_k=-1
            )
            callbacks.append(every)
        trainer = pl.Trainer(
            accelerator="cpu",
            max_steps=args.steps,
            callbacks=callbacks,
            plugins=[] if vault is None else [VaultCheckpointIO(vault, "bench/lightning")],
            enable_checkpointing=checkpoints,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        t0, cpu = time.perf_counter(), cpu_seconds()
        trainer.fit(MLP(), loader)  # the plugin's teardown waits for its uploads
        return clock.clock.result(name, time.perf_counter() - t0, cpu_seconds() - cpu)

    return repeated(
        args,
        root,
        "lightning",
        lambda: run("warm-up", False),
        {"no saves": lambda: run("no saves", False), "local torch.save": lambda: run("l", True)},
        ("vault", lambda vault: run("vault", True, vault)),
    )


def repeated(
    args: argparse.Namespace,
    root: Path,
    part: str,
    warm_up: Callable[[], dict[str, Any]],
    local: dict[str, Callable[[], dict[str, Any]]],
    vaulted: tuple[str, Callable[[VaultClient], dict[str, Any]]],
) -> dict[str, Any]:
    """A warm-up run (discarded), then `--repeat` rounds of every way, in turn; each
    vault run gets a fresh server (same seeds: a second run into the same server would
    dedup completely). Medians of the rounds, and the first vault run's storage."""
    warm_up()
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in [*local, vaulted[0]]}
    storage: dict[str, Any] = {}
    for i in range(args.repeat):
        for name, run in local.items():
            rounds[name].append(run())
        with fresh_vault(root / f"server-{i}") as (vault, data_dir, pid):
            before, server_cpu = allocated(data_dir), cpu_seconds(pid)
            rounds[vaulted[0]].append(vaulted[1](vault))
            rounds[vaulted[0]][-1]["server_cpu_s"] = cpu_seconds(pid) - server_cpu
            storage = storage or storage_row(vault, f"bench/{part}", data_dir, before)
        for name, got in rounds.items():
            log(f"{part} {name}: {got[-1]['step_ms']:.1f} ms/step")
    runs = [
        {k: statistics.median(r[k] for r in got) for k in got[0] if k != "run"} | {"run": name}
        for name, got in rounds.items()
    ]
    return {"runs": runs, "storage": storage, "rounds": rounds}


def report(part: str, result: dict[str, Any], save_every: int) -> str:
    base = result["runs"][0]
    rounds = result["rounds"]

    def spread(name: str) -> str:
        values = sorted(r["step_ms"] for r in rounds[name])
        return f"{values[0]:.0f}-{values[-1]:.0f}"

    rows = [
        (
            r["run"],
            f"{r['step_ms']:.1f}",
            spread(r["run"]),
            f"{(r['step_ms'] - base['step_ms']) * save_every:+.0f}",
            f"{r['blocked_ms']:.0f}" if r["blocked_ms"] else "-",
            f"{r['cpu_s'] - base['cpu_s']:+.1f}",
            f"{r['server_cpu_s']:.1f}" if r["server_cpu_s"] else "-",
            f"{r['total_s']:.1f}",
        )
        for r in result["runs"]
    ]
    header = (
        "run",
        "ms/step",
        "rounds' range",
        "ms per save",
        "read ms/save",
        "CPU s vs none",
        "server CPU s",
        "total s",
    )
    s = result["storage"]
    disk = (
        f"{s['checkpoints']} checkpoints, {s['logical_mb']:.0f} MB of files: engine stored "
        f"{s['stored_mb']:.0f} MB ({s['stored_ratio']:.2f}), data dir grew {s['disk_mb']:.0f} MB "
        f"allocated ({s['disk_ratio']:.2f})"
    )
    title = f"{part}: step time, medians of {len(next(iter(rounds.values())))} rounds"
    return table(title, header, rows) + "\n" + disk + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", default=",".join(PARTS), help="hf, lightning or both")
    parser.add_argument("--steps", type=int, default=41)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=0,
        help="torch's intra-op threads (0: torch's default, one per core); 1 leaves the "
        "other core to the uploads and steadies the figures on a busy 2-core machine",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    parts: dict[str, Callable[[argparse.Namespace, Path], dict[str, Any]]] = {
        "hf": hf_part,
        "lightning": lightning_part,
    }
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-trainers-") as tmp:
        for part in args.part.split(","):
            results[part] = parts[part](args, Path(tmp) / part)
            print(report(part, results[part], args.save_every))
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
