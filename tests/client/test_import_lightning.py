"""A real Lightning `dirpath` imported: ModelCheckpoint's top-k files (and `last.ckpt`),
the best one tagged from the callback state the files carry, then exported back."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.importers import export_series

from ..serverproc import ServerProcess
from .test_import_series import js, tree
from .test_lightning import Tiny

pytestmark = [  # as tests/client/test_lightning.py: Lightning's advice for real runs
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),
    pytest.mark.filterwarnings("ignore:.*does not have many workers:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*smaller than the logging interval:UserWarning"),
]


@pytest.mark.slow
def test_top_k_dirpath_imports_in_step_order_with_the_best_tagged(
    server: ServerProcess, vault: VaultClient, tmp_path: Path
) -> None:
    dirpath = tmp_path / "ckpt"
    # mode="max" on a falling loss: the best is the oldest file kept, not the newest
    top_k = ModelCheckpoint(
        dirpath=dirpath, monitor="train_loss", mode="max", save_top_k=3, save_last=True
    )
    pl.Trainer(
        accelerator="cpu",
        max_epochs=5,
        callbacks=[top_k],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    ).fit(Tiny())
    kept = sorted(p.name for p in dirpath.glob("epoch=*.ckpt"))
    assert len(kept) == 3
    best = Path(top_k.best_model_path).name

    report = js(server, "import", str(dirpath), "imp/lit")
    assert report["layout"] == "lightning"
    assert [e["key"] for e in report["entries"] if e["action"] == "create"] == kept
    (skipped,) = [e for e in report["entries"] if e["action"] == "skip"]
    assert skipped["reason"] == "last.ckpt: no step in its name"

    chain = vault.lineage("imp/lit")[::-1]
    assert [c.metadata["path"] for c in chain] == kept
    assert [c.metadata["step"] for c in chain] == sorted(c.metadata["step"] for c in chain)
    assert all(c.parent == p.id for c, p in zip(chain[1:], chain, strict=False))
    (tagged,) = vault.list("imp/lit", tag="best")
    assert tagged.metadata["path"] == best
    assert tagged.metadata["monitor"] == "train_loss"
    assert tagged.metadata["best_model_score"] == pytest.approx(float(top_k.best_model_score))
    scores = {Path(p).name: float(v) for p, v in top_k.best_k_models.items()}
    for ckpt in chain:
        assert ckpt.metadata["train_loss"] == pytest.approx(scores[ckpt.metadata["path"]])

    out = tmp_path / "out"
    export_series(vault, "imp/lit", out, progress=False)
    assert tree(out) == {k: v for k, v in tree(dirpath).items() if k != "last.ckpt"}
