"""A real Hugging Face Trainer output directory imported with `ckpt import`: a tiny GPT-2
(built from its config, nothing downloaded) trains 10 steps, saving and evaluating every 2,
so the directory holds 5 checkpoints and a best one; a half-written 6th is left beside
them. Resuming from the vault then trains on exactly as resuming from the directory."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # read when transformers is imported: never the network

import shutil
from pathlib import Path

import pytest
import torch
from transformers import Trainer, TrainingArguments

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.hf import resume_from_vault

from ..serverproc import ServerProcess
from .test_hf import Tokens, tiny_gpt2
from .test_import_series import js, tree

STEPS = [2, 4, 6, 8, 10]


def trainer(out: Path, max_steps: int) -> Trainer:
    """Saves and evaluates every 2 steps; the best checkpoint by eval_loss is tracked."""
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=max_steps,
        save_steps=2,
        eval_strategy="steps",
        eval_steps=2,
        metric_for_best_model="eval_loss",
        per_device_train_batch_size=4,
        logging_steps=1,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    return Trainer(model=tiny_gpt2(), args=args, train_dataset=Tokens(), eval_dataset=Tokens(8))


@pytest.mark.slow
def test_trainer_output_imports_as_a_chain_and_resumes_identically(
    server: ServerProcess, vault: VaultClient, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    run = trainer(out, 10)
    run.train()
    best = Path(str(run.state.best_model_checkpoint)).name
    half = out / "checkpoint-12"  # a job killed while writing its next checkpoint
    shutil.copytree(out / "checkpoint-10", half)
    (half / "trainer_state.json").unlink()

    report = js(server, "import", str(out), "imp/hf")
    assert report["layout"] == "hf"
    assert [(e["key"], e["action"]) for e in report["entries"]] == [
        *((f"checkpoint-{s}", "create") for s in STEPS),
        ("checkpoint-12", "skip"),
    ]
    assert report["entries"][-1]["reason"] == "checkpoint-12: half-written (no trainer_state.json)"

    chain = vault.lineage("imp/hf")[::-1]
    assert [c.metadata["step"] for c in chain] == STEPS
    assert chain[0].parent is None
    assert all(c.parent == p.id for c, p in zip(chain[1:], chain, strict=False))
    history = run.state.log_history
    for ckpt in chain:
        step = ckpt.metadata["step"]
        logged = [e for e in history if e.get("step") == step]
        assert ckpt.metadata["eval_loss"] == next(
            e["eval_loss"] for e in logged if "eval_loss" in e
        )
        assert ckpt.metadata["loss"] == next(e["loss"] for e in logged if "loss" in e)
        assert ckpt.metadata["checkpoint_dir"] == f"checkpoint-{step}"
        assert ("best" in ckpt.tags) == (ckpt.metadata["checkpoint_dir"] == best)
        assert sorted(ckpt.files) == sorted(os.listdir(out / f"checkpoint-{step}"))
    assert len(vault.list("imp/hf", tag="best")) == 1

    back = tmp_path / "exported"
    js(server, "export", "imp/hf", str(back))
    want = {
        k: v for k, v in tree(out).items() if k.split("/")[0] in {f"checkpoint-{s}" for s in STEPS}
    }
    assert tree(back) == want  # bytes, names and modification times

    from_dir = trainer(tmp_path / "from-dir", 14)
    from_dir.train(resume_from_checkpoint=str(out / "checkpoint-10"))
    resume = resume_from_vault(vault, "imp/hf", dest=tmp_path / "from-vault")
    assert resume == str(tmp_path / "from-vault" / "checkpoint-10")
    from_vault = trainer(tmp_path / "from-vault", 14)
    from_vault.train(resume_from_checkpoint=resume)
    assert from_vault.state.global_step == from_dir.state.global_step == 14
    want, got = from_dir.model.state_dict(), from_vault.model.state_dict()
    assert want.keys() == got.keys()
    for key, tensor in want.items():
        assert torch.equal(got[key], tensor), key
