"""`ckpt import` and `ckpt export` as a user runs them: rates and what the vault stores
against the source's size, one source kind at a time. Run by hand, never by the test suite
(needs the `hf` and `lightning` extras, and for `postgres` PostgreSQL's binaries and
langgraph-checkpoint-postgres).

    python bench/bench_moving.py                          # every source
    python bench/bench_moving.py --source plain --source hf --json

Each source gets a fresh server (so its data dir holds that import alone) and is made here,
seeded:

- `hf`: a Trainer run of a GPT-2 built from its config (4 layers, width 256, vocabulary
  8000) for 10 steps, saving every 2: 5 `checkpoint-N/` of ~63 MB (Adam moves every
  weight every step, so consecutive checkpoints share little);
- `lightning`: a 2048x2048 linear layer with Adam, ModelCheckpoint top-5 over 5 epochs;
- `plain`, `dcp`: a 32 MiB tensor saved at 5 steps (`torch.save` files, DCP directories),
  one eighth of it changed between steps: what dedup is for;
- `sqlite`, `postgres`: a LangGraph graph (two parallel nodes and a join) run 30 turns on
  3 threads with SqliteSaver and PostgresSaver: 360 checkpoints and their writes.

On the server's machine files are handed over by descriptor (the default); `--http` turns
the server's local socket off, so every byte travels over HTTP as from another machine.
Import and export are timed around the `ckpt` subprocess (start-up included, as a user
waits for it); stored bytes are the data dir's allocated bytes (`du -sb`) grown by the
import. The source's size: its checkpoints' file bytes, or the database's (SQLite file;
PostgreSQL tables with indexes and TOAST). MiB = 2^20 bytes.
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

os.environ["HF_HUB_OFFLINE"] = "1"  # a config-built model: nothing to download

from bench_client import wait_healthy
from bench_ingest import Server, log, table
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from pgserver import PgServer

SOURCES = ("hf", "lightning", "plain", "dcp", "sqlite", "postgres")
MIB = 1 << 20
TURNS = 30
THREADS = ("alpha", "beta", "gamma")


def du(path: Path) -> int:
    """Allocated bytes under `path`, as `du -sb` counts them."""
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def files_size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def ckpt(server: Server, *args: str) -> tuple[dict[str, Any], float]:
    """Run `ckpt ... --json`; its answer and the seconds it took."""
    env = {**os.environ, "CKPT_URL": server.url, "CKPT_TOKEN": server.token()}
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "checkpoint_vault.cli", *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"ckpt {' '.join(args)}: {out.stderr.strip()}")
    return json.loads(out.stdout), seconds


def hf_run(work: Path) -> tuple[str, int, int]:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
        def __init__(self) -> None:
            self.ids = torch.randint(0, 8000, (64, 32), generator=torch.Generator().manual_seed(1))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_head=4, n_embd=256, vocab_size=8000))
    out = work / "hf"
    args = TrainingArguments(
        output_dir=str(out), max_steps=10, save_steps=2, per_device_train_batch_size=4,
        report_to=[], use_cpu=True, disable_tqdm=True, seed=0,
    )  # fmt: skip
    Trainer(model=model, args=args, train_dataset=Tokens()).train()
    dirs = [d for d in out.iterdir() if d.name.startswith("checkpoint-")]
    return str(out), sum(files_size(d) for d in dirs), len(dirs)


def lightning_run(work: Path) -> tuple[str, int, int]:
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.callbacks import ModelCheckpoint

    class Layer(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2048, 2048)

        def training_step(self, batch: list[torch.Tensor], i: int) -> torch.Tensor:
            loss = self.layer(batch[0]).square().mean()
            self.log("train_loss", loss, on_epoch=True, on_step=False)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-4)

        def train_dataloader(self) -> torch.utils.data.DataLoader[Any]:
            data = torch.randn(16, 2048, generator=torch.Generator().manual_seed(0))
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=8)

    out = work / "lightning"
    top_k = ModelCheckpoint(dirpath=out, monitor="train_loss", save_top_k=5)
    trainer = pl.Trainer(
        accelerator="cpu", max_epochs=5, callbacks=[top_k], logger=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Layer())
    return str(out), files_size(out), len(list(out.glob("*.ckpt")))


def tensor_series(work: Path, kind: str) -> tuple[str, int, int]:
    import torch
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    weights = torch.randn(64, 1 << 17)  # 32 MiB
    out = work / kind
    out.mkdir()
    for i, step in enumerate(range(1000, 6000, 1000)):
        weights[i * 8 : (i + 1) * 8] += 1  # an eighth changes per step
        if kind == "plain":
            torch.save({"w": weights}, out / f"model_{step}.pt")
        else:
            dcp.save({"w": weights.clone()}, checkpoint_id=str(out / f"step-{step}"))
    return str(out), files_size(out), 5


class State(TypedDict):
    """The graph's state (at module level: LangGraph reads its annotations by name)."""

    messages: Annotated[list[AnyMessage], add_messages]
    visits: Annotated[list[str], operator.add]


def run_graph(saver: Any) -> None:
    def node(name: str) -> Callable[[State], dict[str, Any]]:
        def step(state: State) -> dict[str, Any]:
            n = len(state["messages"])
            return {"messages": [AIMessage(f"{name} {n} " * 20, id=f"{name}{n}")], "visits": [name]}

        return step

    builder = StateGraph(State)
    for name in ("left", "right", "join"):
        builder.add_node(name, node(name))
    builder.add_edge(START, "left")
    builder.add_edge(START, "right")
    builder.add_edge(["left", "right"], "join")
    builder.add_edge("join", END)
    graph = builder.compile(checkpointer=saver)
    for thread in THREADS:
        for turn in range(TURNS):
            message = HumanMessage(f"turn {turn}", id=f"h{turn}")
            graph.invoke({"messages": [message]}, {"configurable": {"thread_id": thread}})


def measure(name: str, source: str, size: int, count: int, dest: str, work: Path) -> dict[str, Any]:
    server = Server(work / f"data-{name}", work / f"server-{name}.log")
    server.start()
    try:
        wait_healthy(server)
        before = du(server.data_dir)
        _, t_in = ckpt(server, "import", source, f"moving/{name}")
        stored = du(server.data_dir) - before
        _, t_out = ckpt(server, "export", f"moving/{name}", dest)
    finally:
        server.stop()
    return {
        "source": name, "bytes": size, "checkpoints": count, "import_s": t_in,
        "export_s": t_out, "stored_bytes": stored,
    }  # fmt: skip


def one(name: str, work: Path, pg: PgServer | None) -> dict[str, Any]:
    log(f"making the {name} source")
    if name in ("hf", "lightning", "plain", "dcp"):
        make = {"hf": hf_run, "lightning": lightning_run}.get(name)
        source, size, count = make(work) if make else tensor_series(work, name)
        return measure(name, source, size, count, str(work / f"out-{name}"), work)
    if name == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        db = work / "agents.sqlite"
        run_graph(SqliteSaver(sqlite3.connect(db, check_same_thread=False)))
        dest = str(work / "out.sqlite")
        return measure(name, str(db), db.stat().st_size, 4 * TURNS * 3, dest, work)
    return postgres(work, pg)


def postgres(work: Path, pg: PgServer | None) -> dict[str, Any]:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver

    assert pg is not None
    base = f"postgresql://postgres@127.0.0.1:{pg.port}"
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute("CREATE DATABASE agents")
        conn.execute("CREATE DATABASE exported")
    with PostgresSaver.from_conn_string(f"{base}/agents") as saver:
        saver.setup()
        run_graph(saver)
    with psycopg.connect(f"{base}/agents") as conn:
        row = conn.execute(
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind = 'r'"
        ).fetchone()
    size = int(row[0]) if row and row[0] else 0
    return measure("postgres", f"{base}/agents", size, 4 * TURNS * 3, f"{base}/exported", work)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", action="append", choices=SOURCES, default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--http", action="store_true", help="no local socket: every byte over HTTP, as remotely"
    )
    args = parser.parse_args()
    if args.http:
        os.environ["CKPT_SERVER_LOCAL_SOCKET"] = "false"  # the server reads its env at start
    warnings.simplefilter("ignore")  # Lightning's and DCP's advice for real runs
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-moving-") as tmp:
        work = Path(tmp)
        for name in args.source or SOURCES:
            if name == "postgres":
                with PgServer() as pg:
                    rows.append(one(name, work, pg))
            else:
                rows.append(one(name, work, None))
    print(
        table(
            "ckpt import / export",
            (
                "source",
                "MiB",
                "ckpts",
                "import MiB/s",
                "ckpt/s",
                "export MiB/s",
                "ckpt/s",
                "stored MiB",
                "stored/source",
            ),
            [
                (
                    r["source"],
                    f"{r['bytes'] / MIB:.1f}",
                    str(r["checkpoints"]),
                    f"{r['bytes'] / MIB / r['import_s']:.1f}",
                    f"{r['checkpoints'] / r['import_s']:.1f}",
                    f"{r['bytes'] / MIB / r['export_s']:.1f}",
                    f"{r['checkpoints'] / r['export_s']:.1f}",
                    f"{r['stored_bytes'] / MIB:.1f}",
                    f"{r['stored_bytes'] / r['bytes']:.2f}",
                )
                for r in rows
            ],
        )
    )
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
