"""A Lightning fine-tune checkpointing to `s3://` through s3fs into the S3 endpoint: each
`.ckpt` becomes a vault checkpoint (the namespace's policy names `*.ckpt` its marker), the
run resumes from one, and five checkpoints take no more than the vault's own client
stores for the same files, plus 5%."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec  # type: ignore[import-untyped]  # no type hints
import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from checkpoint_vault.client.sync import VaultClient
from tests.s3endpoint import REGION, S3Server, start

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),
    pytest.mark.filterwarnings("ignore:.*does not have many workers:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*smaller than the logging interval:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*exists and is not empty:UserWarning"),  # the resume
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]
EPOCHS = 5
BUCKET = "finetune"


class FineTune(pl.LightningModule):
    """A frozen base (4 MiB of fp32) and a small trainable head: most bytes of each
    checkpoint are the same from one to the next."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(1)
        self.base = torch.nn.Linear(1024, 1024)
        with torch.no_grad():
            self.base.weight.copy_(torch.randn(1024, 1024, generator=generator))
        self.base.requires_grad_(False)
        self.head = torch.nn.Linear(1024, 4)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.head(self.base(x)), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.head.parameters(), lr=1e-3)

    def train_dataloader(self) -> torch.utils.data.DataLoader[Any]:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(16, 1024, generator=generator)
        data = torch.utils.data.TensorDataset(x, x[:, :4])
        return torch.utils.data.DataLoader(data, batch_size=8)


class StartStep(pl.Callback):
    step = -1

    def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.step = trainer.global_step
        assert isinstance(module, FineTune)
        self.head = {k: v.clone() for k, v in module.head.state_dict().items()}


def _trainer(epochs: int, *callbacks: pl.Callback) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        callbacks=list(callbacks),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=f"s3://{BUCKET}/run",
    )


@pytest.fixture
def s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    srv = start(tmp_path / "endpoint")
    key, secret = srv.credentials()
    # What a user puts in fsspec's config (or AWS_* variables) to point s3:// at the vault.
    monkeypatch.setitem(
        fsspec.config.conf,
        "s3",
        {
            "key": key,
            "secret": secret,
            "client_kwargs": {"endpoint_url": srv.endpoint, "region_name": REGION},
            "skip_instance_cache": True,
        },
    )
    try:
        yield srv
    finally:
        srv.server.stop()


@pytest.mark.slow
def test_lightning_through_s3fs_resumes_and_stores_no_more(s3: S3Server, tmp_path: Path) -> None:
    with VaultClient(s3.server.url, s3.server.token) as vault:
        # Lightning writes one file per checkpoint: that file is the completion marker.
        vault.set_policy(None, {"s3": {"markers": ["*.ckpt"]}})
        torch.manual_seed(0)
        saves = ModelCheckpoint(dirpath=f"s3://{BUCKET}/run/ckpts", save_top_k=-1)
        _trainer(EPOCHS, saves).fit(FineTune())
        fs = fsspec.filesystem("s3")
        names = sorted(p.rsplit("/", 1)[-1] for p in fs.find(f"{BUCKET}/run/ckpts"))
        assert names == [f"epoch={e}-step={2 * (e + 1)}.ckpt" for e in range(EPOCHS)]
        live = list(reversed(vault.list(BUCKET)))
        assert len(live) == EPOCHS
        assert [c.parent for c in live[1:]] == [c.id for c in live[:-1]]

        files = {n: fs.cat_file(f"{BUCKET}/run/ckpts/{n}") for n in names}
        endpoint_stored = vault.stats().stored_bytes

        resumed = StartStep()
        path = f"s3://{BUCKET}/run/ckpts/epoch=2-step=6.ckpt"
        again = ModelCheckpoint(dirpath=f"s3://{BUCKET}/run/ckpts", save_top_k=-1)
        _trainer(EPOCHS + 1, resumed, again).fit(FineTune(), ckpt_path=path)
        assert resumed.step == 6
        with fs.open(path, "rb") as f:
            saved = torch.load(f, weights_only=True)["state_dict"]
        for k, v in resumed.head.items():
            assert torch.equal(v, saved[f"head.{k}"])

    own = start(tmp_path / "client")
    try:
        with VaultClient(own.server.url, own.server.token) as direct:
            parent = None
            for name in names:
                parent = direct.save(BUCKET, {f"run/ckpts/{name}": files[name]}, parent=parent).id
            client_stored = direct.stats().stored_bytes
    finally:
        own.server.stop()
    print(f"stored: endpoint {endpoint_stored}, client {client_stored}")
    assert endpoint_stored <= client_stored * 1.05
