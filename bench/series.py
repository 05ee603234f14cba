"""Seeded, realistic checkpoint series made with real libraries (PyTorch, safetensors).

Run by hand, never by the test suite. Needs `pip install torch==2.13.0 safetensors numpy`
(torch only for the tensor series; `agent` needs nothing but the standard library).

    python bench/series.py --list
    python bench/series.py lora --out /tmp/lora          # DIR/ckpt-000/..., sizes, timings
    python bench/series.py agent --out /tmp/agent --seed 3 --count 20

Each series is a generator function `series(work_dir, seed=0, count=None)` that yields, per
checkpoint, a dict `{file_name: bytes | Path}`. Large files are written under
`work_dir/ckpt-NNN/` and yielded as paths; small ones are yielded as bytes. A yielded path
belongs to the consumer: the generator never reads it again, so it may be moved or deleted
at once. The bytes depend only on the seed (and the count): the same seed on the same
machine, torch version and thread count gives byte-identical files.

- `lora`: a frozen ~48M-parameter fp32 transformer with rank-8 adapters on the q/k/v/o
  projections trained by Adam on random tokens; `model.pt` (torch.save of base + adapters +
  optimizer state) every 3 steps, 10 checkpoints of ~198 MB. Only ~0.4M parameters and
  their Adam moments change between checkpoints.
- `finetune`: full fine-tuning of a ~20M-parameter transformer with AdamW, 2 steps between
  checkpoints, 8 checkpoints, each `train.pt` (model + optimizer) and `model.safetensors`
  (weights only). Every weight changes every step; the safetensors weights repeat the
  tensors inside train.pt.
- `embedding`: a 400,000 x 64 fp32 embedding table (102.4 MB); 2% of the rows, chosen at
  random, get small random deltas between checkpoints; `table.pt`, 10 checkpoints.
- `bf16`: the `finetune` model and loop in bfloat16 (weights, gradients and AdamW moments
  all bf16), 2 steps between checkpoints, 8 checkpoints of `train.pt` + `model.safetensors`
  (~123 + ~41 MB). Two-byte elements: the case byte grouping with width 2 is for.
- `agent`: an agent's state as JSON (messages with role/content/tool calls, a scratchpad),
  growing by 1-3 messages per step with an occasional edit in the middle of the history;
  200 snapshots, each `state.json` yielded as bytes.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Checkpoint = dict[str, bytes | Path]
MB = 1_000_000
MiB = 1 << 20


def ckpt_dir(work_dir: Path, index: int) -> Path:
    """Where checkpoint `index` of a series keeps its files: work_dir/ckpt-NNN."""
    path = Path(work_dir) / f"ckpt-{index:03d}"
    path.mkdir(parents=True, exist_ok=True)
    return path


# -- a small transformer built from torch.nn layers -----------------------------------------


def _torch() -> Any:
    """Import torch lazily so `--list` and `agent` work without it."""
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise SystemExit(
            "series.py: this series needs PyTorch: pip install torch==2.13.0 safetensors numpy"
        ) from e
    return torch


@dataclass(frozen=True)
class ModelShape:
    vocab: int
    context: int
    d_model: int
    heads: int
    layers: int
    ff: int


# ~48.1M parameters: 2 x 10000 x 512 (embedding, untied head) + 12 x 3.15M (blocks).
LORA_SHAPE = ModelShape(vocab=10000, context=256, d_model=512, heads=8, layers=12, ff=2048)
# ~20.4M parameters: 2 x 8000 x 384 + 8 x 1.77M.
FINETUNE_SHAPE = ModelShape(vocab=8000, context=256, d_model=384, heads=6, layers=8, ff=1536)


def build_model(shape: ModelShape, lora_rank: int = 0) -> Any:
    """A pre-LayerNorm causal transformer LM; with `lora_rank`, the q/k/v/o projections
    are wrapped in LoRA adapters and everything else is frozen. Initialised from torch's
    global RNG (seed it first)."""
    torch = _torch()
    nn = torch.nn
    functional = torch.nn.functional

    class LoRALinear(nn.Module):  # type: ignore[misc]
        """y = base(x) + (x A^T B^T) * alpha / r, with `base` frozen, B starting at zero."""

        def __init__(self, base: Any, rank: int, alpha: float = 16.0) -> None:
            super().__init__()
            self.base = base
            self.base.weight.requires_grad_(False)
            self.base.bias.requires_grad_(False)
            self.lora_a = nn.Parameter(torch.randn(rank, base.in_features) / rank)
            self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))
            self.scale = alpha / rank

        def forward(self, x: Any) -> Any:
            return self.base(x) + (x @ self.lora_a.T @ self.lora_b.T) * self.scale

    class Block(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            d = shape.d_model
            self.ln1 = nn.LayerNorm(d)
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
            self.ln2 = nn.LayerNorm(d)
            self.fc1 = nn.Linear(d, shape.ff)
            self.fc2 = nn.Linear(shape.ff, d)

        def forward(self, x: Any) -> Any:
            b, t, d = x.shape
            h = self.ln1(x)

            def heads(proj: Any) -> Any:
                return proj(h).view(b, t, shape.heads, d // shape.heads).transpose(1, 2)

            a = functional.scaled_dot_product_attention(
                heads(self.q), heads(self.k), heads(self.v), is_causal=True
            )
            x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(functional.gelu(self.fc1(self.ln2(x))))

    class LM(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(shape.vocab, shape.d_model)
            self.pos = nn.Embedding(shape.context, shape.d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(shape.layers))
            self.ln_f = nn.LayerNorm(shape.d_model)
            self.head = nn.Linear(shape.d_model, shape.vocab, bias=False)

        def forward(self, tokens: Any) -> Any:
            x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1]))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln_f(x))

    model = LM()
    if lora_rank:
        model.requires_grad_(False)
        for block in model.blocks:
            for name in ("q", "k", "v", "o"):
                setattr(block, name, LoRALinear(getattr(block, name), lora_rank))
    return model


def train_steps(model: Any, opt: Any, gen: Any, steps: int, batch: int, seq: int) -> float:
    """`steps` real optimizer steps of next-token prediction on random tokens; last loss."""
    torch = _torch()
    vocab = model.head.out_features
    loss = torch.zeros(())
    for _ in range(steps):
        tokens = torch.randint(0, vocab, (batch, seq + 1), generator=gen)
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1)
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return float(loss.detach())


def parameter_count(model: Any, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


# -- the series ----------------------------------------------------------------------------


def lora(work_dir: Path, seed: int = 0, count: int | None = None) -> Iterator[Checkpoint]:
    """Frozen ~48M-parameter base + rank-8 q/k/v/o adapters trained with Adam; `model.pt`
    (base + adapters + Adam state) every 3 steps; 10 checkpoints by default."""
    torch = _torch()
    torch.manual_seed(seed)
    model = build_model(LORA_SHAPE, lora_rank=8)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(trainable, lr=1e-3)
    gen = torch.Generator().manual_seed(seed + 1)
    for i in range(10 if count is None else count):
        loss = train_steps(model, opt, gen, steps=3, batch=4, seq=64)
        path = ckpt_dir(work_dir, i) / "model.pt"
        state = {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "step": 3 * (i + 1),
            "loss": loss,
            "config": {"lora_rank": 8, "lora_alpha": 16.0, "targets": ["q", "k", "v", "o"]},
        }
        torch.save(state, path)
        yield {"model.pt": path}


def finetune(work_dir: Path, seed: int = 0, count: int | None = None) -> Iterator[Checkpoint]:
    """Full fine-tuning of a ~20M-parameter model with AdamW, 2 steps between checkpoints;
    `train.pt` (model + optimizer) and `model.safetensors` (weights); 8 by default."""
    return _full_finetune(work_dir, seed, count, bf16=False, lr=1e-4, batch=8, seq=64)


def bf16(work_dir: Path, seed: int = 0, count: int | None = None) -> Iterator[Checkpoint]:
    """`finetune` in bfloat16: the same ~20M-parameter model cast to bf16 and trained with
    AdamW (its moments bf16 too), 2 steps between checkpoints; 8 by default. A larger lr
    (bf16 has 8 mantissa bits, so 1e-4 steps would mostly round away) and a smaller batch
    (bf16 matmuls on CPU are several times slower) than finetune's."""
    return _full_finetune(work_dir, seed, count, bf16=True, lr=1e-3, batch=2, seq=32)


def _full_finetune(
    work_dir: Path,
    seed: int,
    count: int | None,
    *,
    bf16: bool,
    lr: float,
    batch: int,
    seq: int,
) -> Iterator[Checkpoint]:
    torch = _torch()
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    model = build_model(FINETUNE_SHAPE)
    if bf16:
        model = model.to(torch.bfloat16)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed + 1)
    for i in range(8 if count is None else count):
        loss = train_steps(model, opt, gen, steps=2, batch=batch, seq=seq)
        out = ckpt_dir(work_dir, i)
        state = {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "step": 2 * (i + 1),
            "loss": loss,
        }
        torch.save(state, out / "train.pt")
        weights = {k: v.contiguous() for k, v in model.state_dict().items()}
        save_file(weights, str(out / "model.safetensors"), metadata={"step": str(2 * (i + 1))})
        yield {"train.pt": out / "train.pt", "model.safetensors": out / "model.safetensors"}


EMBEDDING_ROWS = 400_000
EMBEDDING_DIM = 64
EMBEDDING_UPDATE_FRACTION = 0.02


def embedding(work_dir: Path, seed: int = 0, count: int | None = None) -> Iterator[Checkpoint]:
    """A 400k x 64 fp32 table (102.4 MB); 2% of the rows (random ones) get small random
    deltas between checkpoints; `table.pt`; 10 checkpoints by default."""
    torch = _torch()
    gen = torch.Generator().manual_seed(seed)
    table = torch.randn(EMBEDDING_ROWS, EMBEDDING_DIM, generator=gen) * 0.05
    updated = int(EMBEDDING_ROWS * EMBEDDING_UPDATE_FRACTION)
    for i in range(10 if count is None else count):
        if i:
            rows = torch.randperm(EMBEDDING_ROWS, generator=gen)[:updated]
            table[rows] += torch.randn(updated, EMBEDDING_DIM, generator=gen) * 1e-3
        path = ckpt_dir(work_dir, i) / "table.pt"
        torch.save(
            {"embedding.weight": table, "step": i, "rows_updated": updated if i else 0}, path
        )
        yield {"table.pt": path}


# -- agent state ---------------------------------------------------------------------------

_WORD_TEXT = (
    "the a to of and in is for that with on this it as be file test function error value "
    "result config server request response token chunk checkpoint model loss step batch "
    "retry timeout path module import return class def self data list dict string bytes "
    "check failed passed run build install update plan next first then because should "
    "would could need look see found missing expected actual line column call tool search "
    "read write open close commit branch merge issue fix bug patch review latency memory"
)
_WORDS = _WORD_TEXT.split()
_TOOLS = ("read_file", "search_code", "run_tests", "edit_file", "shell", "web_fetch")
_PATHS = ("src/app.py", "src/util/io.py", "tests/test_app.py", "README.md", "setup.cfg")


def _sentence(rng: random.Random, lo: int, hi: int) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(lo, hi))]
    return " ".join(words).capitalize() + "."


def _paragraphs(rng: random.Random, n: int) -> str:
    return "\n\n".join(
        " ".join(_sentence(rng, 6, 18) for _ in range(rng.randint(2, 5))) for _ in range(n)
    )


def _code(rng: random.Random, lines: int) -> str:
    out = []
    for k in range(lines):
        indent = "    " * rng.randint(0, 2)
        a, b = rng.choice(_WORDS), rng.choice(_WORDS)
        out.append(f"{indent}{a}_{b} = {rng.choice(_WORDS)}({rng.randint(0, 999)})  # {k}")
    return "\n".join(out)


def _tool_call(rng: random.Random, n: int) -> dict[str, Any]:
    tool = rng.choice(_TOOLS)
    if tool in ("read_file", "edit_file"):
        args: dict[str, Any] = {"path": rng.choice(_PATHS)}
        if tool == "edit_file":
            args["old"] = _sentence(rng, 3, 8)
            args["new"] = _sentence(rng, 3, 8)
    elif tool == "shell":
        args = {"command": f"pytest -x -q tests/ -k {rng.choice(_WORDS)}", "timeout": 120}
    else:
        args = {"query": " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 6)))}
    return {
        "id": f"call_{n:05d}_{rng.getrandbits(32):08x}",
        "type": "function",
        "function": {"name": tool, "arguments": json.dumps(args)},
    }


def _turn(rng: random.Random, messages: list[dict[str, Any]]) -> None:
    """Append one step's worth of messages (1-3)."""
    n = len(messages)
    kind = rng.random()
    if kind < 0.25:
        messages.append({"role": "user", "content": _paragraphs(rng, rng.randint(1, 2))})
    if kind < 0.6 or len(messages) < 2:
        messages.append({"role": "assistant", "content": _paragraphs(rng, rng.randint(1, 3))})
        return
    call = _tool_call(rng, n)
    messages.append({"role": "assistant", "content": _sentence(rng, 5, 15), "tool_calls": [call]})
    body = _code(rng, rng.randint(10, 60)) if rng.random() < 0.5 else _paragraphs(rng, 3)
    messages.append({"role": "tool", "tool_call_id": call["id"], "content": body})


def _edit_middle(rng: random.Random, messages: list[dict[str, Any]], step: int) -> None:
    """Edit one message in the middle of the history: compact an old tool output (as agents
    do to save context) or amend an earlier assistant message."""
    k = rng.randrange(len(messages) // 4, 3 * len(messages) // 4)
    msg = dict(messages[k])
    if msg["role"] == "tool" and not msg["content"].startswith("[compacted"):
        msg["content"] = f"[compacted at step {step}: {len(msg['content'])} chars elided]"
    else:
        msg["content"] = msg["content"] + f"\n\n(edited at step {step}: {_sentence(rng, 4, 10)})"
    messages[k] = msg


def agent(work_dir: Path, seed: int = 0, count: int | None = None) -> Iterator[Checkpoint]:
    """An agent's JSON state: 1-3 new messages per step, an edit in the middle of the history
    every ~12 steps; `state.json` as bytes; 200 snapshots by default. `work_dir` is unused."""
    del work_dir
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " + _paragraphs(rng, 2)},
        {"role": "user", "content": _paragraphs(rng, 2)},
    ]
    scratchpad: dict[str, Any] = {"plan": [], "notes": [], "open_files": []}
    for step in range(200 if count is None else count):
        before = len(messages)
        while len(messages) - before < 1:
            _turn(rng, messages)
        if step and step % 12 == 0 and len(messages) > 8:
            _edit_middle(rng, messages, step)
        if rng.random() < 0.3:
            scratchpad["plan"] = [_sentence(rng, 3, 9) for _ in range(rng.randint(2, 6))]
        if rng.random() < 0.2:
            scratchpad["notes"].append(_sentence(rng, 5, 14))
        scratchpad["open_files"] = sorted(rng.sample(_PATHS, rng.randint(1, 3)))
        state = {
            "agent_id": f"agent-{seed}",
            "model": "example-model-1",
            "step": step,
            "updated_at": f"2026-01-01T00:{step // 60 % 60:02d}:{step % 60:02d}Z",
            "token_usage": {"prompt": 900 * (step + 1), "completion": 150 * (step + 1)},
            "messages": messages,
            "scratchpad": scratchpad,
        }
        yield {"state.json": json.dumps(state, indent=2).encode()}


# -- registry and command line -------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    name: str
    make: Callable[..., Iterator[Checkpoint]]
    checkpoints: int
    chunking: str  # the vault chunking profile that suits it: "large" or "small"
    summary: str


SERIES: dict[str, Series] = {
    s.name: s
    for s in (
        Series(
            "lora",
            lora,
            10,
            "large",
            "frozen ~48M-param base + rank-8 q/k/v/o adapters + Adam state, model.pt ~198 MB",
        ),
        Series(
            "finetune",
            finetune,
            8,
            "large",
            "full AdamW fine-tune of ~20M params: train.pt ~245 MB + model.safetensors ~82 MB",
        ),
        Series(
            "bf16",
            bf16,
            8,
            "large",
            "finetune in bfloat16 with AdamW: train.pt ~123 MB + model.safetensors ~41 MB",
        ),
        Series(
            "embedding",
            embedding,
            10,
            "large",
            "400k x 64 fp32 table (102 MB), 2% random rows updated per checkpoint, table.pt",
        ),
        Series(
            "agent",
            agent,
            200,
            "small",
            "agent JSON state growing 1-3 messages per step, edits in the middle, state.json",
        ),
    )
}


def file_size(item: bytes | Path) -> int:
    return len(item) if isinstance(item, bytes) else Path(item).stat().st_size


def write_series(name: str, out: Path, seed: int, count: int | None, quiet: bool = False) -> dict:
    """Generate series `name` into out/ckpt-NNN/; answer a summary (sizes, seconds)."""
    series = SERIES[name]
    out.mkdir(parents=True, exist_ok=True)
    sizes: list[dict[str, int]] = []
    start = time.perf_counter()
    for i, ckpt in enumerate(series.make(out, seed=seed, count=count)):
        for fname, item in ckpt.items():
            if isinstance(item, bytes):
                (ckpt_dir(out, i) / fname).write_bytes(item)
        sizes.append({fname: file_size(item) for fname, item in ckpt.items()})
        every = 1 if series.checkpoints <= 20 else 20
        if not quiet and (i % every == 0 or i + 1 == (count or series.checkpoints)):
            elapsed = time.perf_counter() - start
            files = ", ".join(f"{f} {n / MB:.2f} MB" for f, n in sizes[-1].items())
            print(f"ckpt-{i:03d}: {files}  ({elapsed:.1f} s)", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - start
    total = sum(sum(s.values()) for s in sizes)
    return {
        "series": name,
        "seed": seed,
        "out": str(out),
        "checkpoints": len(sizes),
        "total_bytes": total,
        "last_checkpoint_bytes": sum(sizes[-1].values()) if sizes else 0,
        "files": sizes,
        "seconds": seconds,
        "torch_threads": _threads(),
    }


def _threads() -> int | None:
    if "torch" not in sys.modules:
        return None
    return int(sys.modules["torch"].get_num_threads())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="series.py", description="Generate a seeded, realistic checkpoint series."
    )
    p.add_argument("series", nargs="?", choices=sorted(SERIES), help="which series")
    p.add_argument("--list", action="store_true", help="list the series and exit")
    p.add_argument("--out", type=Path, help="write DIR/ckpt-000/... here")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--count", type=int, default=None, help="checkpoints (default: the series')")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    args = p.parse_args(argv)
    if args.list:
        for s in SERIES.values():
            print(
                f"{s.name:10} {s.checkpoints:4} checkpoints  chunking {s.chunking:5}  {s.summary}"
            )
        return 0
    if args.series is None or args.out is None:
        p.error("give a SERIES and --out DIR (or --list)")
    if args.count is not None and args.count < 1:
        p.error("--count must be at least 1")
    summary = write_series(args.series, args.out, args.seed, args.count, quiet=args.json)
    if args.json:
        print(json.dumps(summary))
    else:
        total, last = summary["total_bytes"], summary["last_checkpoint_bytes"]
        print(
            f"{summary['series']}: {summary['checkpoints']} checkpoints, "
            f"{total / MB:.1f} MB in all, last {last / MB:.2f} MB, "
            f"generated in {summary['seconds']:.1f} s into {summary['out']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
