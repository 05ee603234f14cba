"""client.lightning with the real Lightning Trainer against a real server: a tiny model,
a few CPU epochs, ModelCheckpoint's top-k kept in the vault and resumed from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.plugins.io import AsyncCheckpointIO, CheckpointIO

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.lightning import VaultCheckpointIO

from .conftest import loaded_by

# Lightning's advice for real runs, beside the point for four batches of random numbers;
# and pytorch-lightning 2.6.6 still builds torch's LeafSpec, deprecated in torch 2.13
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),
    pytest.mark.filterwarnings("ignore:.*does not have many workers:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*smaller than the logging interval:UserWarning"),
]


class Tiny(pl.LightningModule):
    """A linear regression whose loss goes down, so top-k by train_loss keeps changing."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> torch.utils.data.DataLoader[Any]:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(32, 8, generator=generator)
        data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
        return torch.utils.data.DataLoader(data, batch_size=8)


class StartStep(pl.Callback):
    """Records where training starts: the global step and the weights."""

    step = -1
    weights: dict[str, torch.Tensor] = {}

    def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.step = trainer.global_step
        self.weights = {k: v.clone() for k, v in module.state_dict().items()}


def trainer(io: CheckpointIO, epochs: int, *callbacks: pl.Callback) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        plugins=[io],
        callbacks=list(callbacks),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def top_k(tmp_path: Path) -> ModelCheckpoint:
    return ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="train_loss", save_top_k=2)


def test_top_k_lives_in_the_vault_and_a_reported_path_resumes(
    vault: VaultClient, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    checkpoints = top_k(tmp_path)
    trainer(VaultCheckpointIO(vault, "lit/topk"), 5, checkpoints).fit(Tiny())
    live = vault.list("lit/topk")
    assert len(live) == 2
    assert {c.metadata["path"] for c in live} == set(checkpoints.best_k_models)
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())
    chain = vault.lineage("lit/topk")  # 5 saves, one chain; removed ones are tombstones
    assert len(chain) == 5
    assert sum(c.deleted for c in chain) == 3

    best = checkpoints.best_model_path
    (saved,) = (c for c in live if c.metadata["path"] == best)
    io = VaultCheckpointIO(vault, "lit/topk")
    state = io.load_checkpoint(best)
    start = StartStep()
    resumed = top_k(tmp_path)
    trainer(io, 6, start, resumed).fit(Tiny(), ckpt_path=best)
    assert start.step == saved.metadata["step"] == state["global_step"]
    for key, tensor in state["state_dict"].items():
        assert torch.equal(start.weights[key], tensor), key
    # the resumed run's top-k counts the first run's checkpoints, and removes them too
    live = vault.list("lit/topk")
    assert {c.metadata["path"] for c in live} == set(resumed.best_k_models)
    assert len(live) == 2


def test_inside_async_checkpoint_io(vault: VaultClient, tmp_path: Path) -> None:
    torch.manual_seed(0)
    checkpoints = top_k(tmp_path)
    io = AsyncCheckpointIO(VaultCheckpointIO(vault, "lit/async"))
    trainer(io, 5, checkpoints).fit(Tiny())
    live = vault.list("lit/async")
    assert {c.metadata["path"] for c in live} == set(checkpoints.best_k_models)
    assert len(live) == 2


def test_saving_a_path_again_replaces_it_and_an_unknown_path_is_not_found(
    vault: VaultClient, tmp_path: Path
) -> None:
    io = VaultCheckpointIO(vault, "lit/paths")
    for step in (1, 2):
        io.save_checkpoint({"global_step": step, "w": torch.ones(2) * step}, tmp_path / "last.ckpt")
    io.teardown()
    (only,) = vault.list("lit/paths")
    assert only.metadata["step"] == 2
    assert torch.equal(io.load_checkpoint(tmp_path / "last.ckpt")["w"], torch.ones(2) * 2)
    with pytest.raises(FileNotFoundError):
        io.load_checkpoint(tmp_path / "other.ckpt")
    io.remove_checkpoint(tmp_path / "last.ckpt")
    assert vault.list("lit/paths") == []


def test_importing_client_lightning_loads_neither_lightning_nor_torch() -> None:
    assert (
        loaded_by(
            "client.lightning",
            {"lightning", "pytorch_lightning", "torch", "aiohttp", "lmdb", "vault", "api"},
        )
        == "[]"
    )


@pytest.mark.slow
def test_a_program_on_lightning_pytorch_gets_a_plugin_of_that_package() -> None:
    """`lightning.pytorch` and `pytorch_lightning` hold distinct CheckpointIO classes: the
    plugin subclasses the one the program imported."""
    code = (
        "import lightning.pytorch as L, sys; "
        "from checkpoint_vault.client.lightning import VaultCheckpointIO; "
        "assert issubclass(VaultCheckpointIO, L.plugins.io.CheckpointIO); "
        "print('pytorch_lightning' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
