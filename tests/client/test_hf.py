"""client.hf with the real transformers Trainer (and Accelerate) against a real server: a
tiny GPT-2 built from its config (nothing downloaded) trains a few steps on the CPU."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # read when transformers is imported: never the network

import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from accelerate import Accelerator
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from checkpoint_vault.client import CheckpointManager, Forbidden, VaultClient
from checkpoint_vault.client.hf import VaultCallback, resume_from_vault

from ..serverproc import ServerProcess
from .conftest import loaded_by

SEQ = 16


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Random token ids, no tokenizer: the labels are the inputs (causal LM)."""

    def __init__(self, n: int = 32) -> None:
        generator = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, 128, (n, SEQ), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class StopAt(TrainerCallback):
    """Stops training after `step`, as a preempted job would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if state.global_step >= self.step:
            control.should_training_stop = True


class SigtermAt(TrainerCallback):
    """Sends this process SIGTERM at the end of `step`, as a scheduler preempting it."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if state.global_step == self.step:
            signal.raise_signal(signal.SIGTERM)


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128)  # the issue's
    return GPT2LMHeadModel(config)


def trainer(
    out: Path, callbacks: list[TrainerCallback], model: GPT2LMHeadModel | None = None, **kw: Any
) -> Trainer:
    options: dict[str, Any] = {
        "max_steps": 6,
        "save_steps": 2,
        "per_device_train_batch_size": 4,
        "logging_steps": 1,
        "learning_rate": 1e-3,
        "report_to": [],
        "use_cpu": True,
        "disable_tqdm": True,
        "seed": 0,
    }
    args = TrainingArguments(output_dir=str(out), **{**options, **kw})
    return Trainer(
        model=model or tiny_gpt2(), args=args, train_dataset=Tokens(), callbacks=callbacks
    )


@pytest.mark.slow
def test_a_run_pushes_a_chain_and_a_resumed_run_ends_identical(
    vault: VaultClient, tmp_path: Path
) -> None:
    whole = trainer(tmp_path / "whole", [VaultCallback(vault, "hf/whole")])
    whole.train()
    chain = vault.lineage("hf/whole")
    assert [c.metadata["step"] for c in chain] == [6, 4, 2]
    assert [c.metadata["checkpoint_dir"] for c in chain] == [f"checkpoint-{s}" for s in (6, 4, 2)]
    assert chain[-1].parent is None
    assert all(c.valid for c in chain)
    assert isinstance(chain[0].metadata["loss"], float)
    assert "model.safetensors" in chain[0].files
    assert "trainer_state.json" in chain[0].files

    first = trainer(tmp_path / "first", [VaultCallback(vault, "hf/resumed"), StopAt(4)])
    first.train()
    assert [c.metadata["step"] for c in vault.lineage("hf/resumed")] == [4, 2]

    out = tmp_path / "second"  # an empty directory: everything comes from the vault
    resume = resume_from_vault(vault, "hf/resumed", dest=out)
    assert resume == str(out / "checkpoint-4")
    second = trainer(out, [VaultCallback(vault, "hf/resumed")])
    second.train(resume_from_checkpoint=resume)
    assert second.state.global_step == 6
    assert [c.metadata["step"] for c in vault.lineage("hf/resumed")] == [6, 4, 2]
    want = whole.model.state_dict()
    got = second.model.state_dict()
    assert want.keys() == got.keys()
    for key, tensor in want.items():
        assert torch.equal(got[key], tensor), key


def test_a_nan_loss_marks_the_checkpoint_invalid_and_resume_skips_it(
    vault: VaultClient, tmp_path: Path
) -> None:
    model = tiny_gpt2()
    with torch.no_grad():
        model.transformer.wte.weight[0, 0] = float("nan")  # every loss from here is NaN
    run = trainer(
        tmp_path / "out",
        [VaultCallback(vault, "hf/nan")],
        model=model,
        max_steps=2,  # overrides the default 6
        logging_nan_inf_filter=False,  # log the NaN as it is
    )
    run.train()
    (checkpoint,) = vault.list("hf/nan")
    assert checkpoint.valid is False
    assert checkpoint.validity.reason == "loss is nan"
    assert resume_from_vault(vault, "hf/nan", dest=tmp_path / "resume") is None
    assert resume_from_vault(vault, "hf/absent", dest=tmp_path / "resume") is None


def test_sigterm_saves_the_step_under_way_and_stops(vault: VaultClient, tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    callbacks = [SigtermAt(3), VaultCallback(vault, "hf/preempt", save_on_sigterm=True)]
    run = trainer(tmp_path / "out", callbacks)
    run.train()
    assert run.state.global_step == 3
    latest = vault.get("hf/preempt")
    assert latest.metadata["step"] == 3
    assert latest.metadata["preempted"] is True
    assert [c.metadata["step"] for c in vault.lineage("hf/preempt")] == [3, 2]
    assert signal.getsignal(signal.SIGTERM) == before


def test_save_total_limit_becomes_keep_last(vault: VaultClient, tmp_path: Path) -> None:
    trainer(tmp_path / "out", [VaultCallback(vault, "hf/limit")], save_total_limit=2).train()
    assert vault.policy("hf/limit").retention.keep_last == 2


def test_without_the_admin_scope_the_run_goes_on_without_keep_rules(
    server: ServerProcess, vault: VaultClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """save_total_limit is only mapped to retention when the token may set policies."""
    secret = vault.create_token("hf-writer", ["read:hf/writer", "write:hf/writer"]).token
    with VaultClient(server.url, secret, progress=False) as writer:
        callback = VaultCallback(writer, "hf/writer")
        trainer(tmp_path, [callback], max_steps=2, save_total_limit=2).train()
        with pytest.raises(Forbidden):  # rules asked for explicitly are refused at once
            CheckpointManager(writer, "hf/writer", keep_last=2)
    assert len(vault.list("hf/writer")) == 1
    assert vault.policy("hf/writer").retention.keep_last is None
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(m.startswith("save_total_limit not kept as hf/writer") for m in warned)


def test_accelerate_save_state_directories_round_trip(vault: VaultClient, tmp_path: Path) -> None:
    """Accelerate's `save_state` directory is pushed and pulled like a Trainer's."""
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    with CheckpointManager(vault, "hf/accelerate") as manager:
        for step in (1, 2):
            accelerator.backward(model(torch.randn(4, 8)).square().mean())
            optimizer.step()
            optimizer.zero_grad()
            accelerator.save_state(str(tmp_path / f"state-{step}"))
            manager.save(step, tmp_path / f"state-{step}")
        want = {k: v.clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            model.weight.zero_()
        restored = manager.restore(dest=str(tmp_path / "pulled"))
    assert restored is not None
    assert restored.metadata["step"] == 2
    accelerator.load_state(str(tmp_path / "pulled"))
    for key, tensor in want.items():
        assert torch.equal(model.state_dict()[key], tensor), key


def test_importing_client_hf_loads_neither_transformers_nor_torch() -> None:
    assert (
        loaded_by(
            "client.hf", {"transformers", "torch", "accelerate", "aiohttp", "lmdb", "vault", "api"}
        )
        == "[]"
    )
