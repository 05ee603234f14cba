"""Lightning checkpoints into the vault: `VaultCheckpointIO`, a `CheckpointIO` plugin.

    from checkpoint_vault.client import VaultClient
    from checkpoint_vault.client.lightning import VaultCheckpointIO
    vault = VaultClient()
    io = VaultCheckpointIO(vault, "runs/lit-exp1")
    trainer = Trainer(plugins=[io], callbacks=[ModelCheckpoint(dirpath="ckpt", save_top_k=2,
                                                               monitor="val_loss")])
    trainer.fit(model)
    trainer.fit(model, ckpt_path=trainer.checkpoint_callback.best_model_path)  # from the vault

ModelCheckpoint still chooses paths, names and which checkpoints to keep; the bytes go to
the vault instead of `dirpath`: each save is a checkpoint of the namespace (a chain, with
`path`, `step` and `epoch` in its metadata), its top-k removals delete there, and any path
it reported resumes through `fit(ckpt_path=...)`. It also works inside Lightning's
`AsyncCheckpointIO(VaultCheckpointIO(...))`.

Importing this module is light. `VaultCheckpointIO` is built on first use of the name, on
the `CheckpointIO` of the Lightning the program already imported (`lightning.pytorch`
or `pytorch_lightning`, which hold distinct classes; with neither imported yet,
`pytorch_lightning`, the `lightning` extra, then `lightning.pytorch`).
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._lightning_io import VaultCheckpointIOMixin as VaultCheckpointIO

__all__ = ["VaultCheckpointIO", "lightning_package"]

PACKAGES = ("pytorch_lightning", "lightning.pytorch")  # the extra's first


def lightning_package() -> str:
    """The Lightning package whose `CheckpointIO` the plugin subclasses: one the program
    has imported, else the first of PACKAGES that imports."""
    for name in PACKAGES:
        if name in sys.modules:
            return name
    for name in PACKAGES:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        return name
    raise ImportError("client.lightning needs pytorch-lightning (pip install '.[lightning]')")


def _build() -> type:
    from ._lightning_io import VaultCheckpointIOMixin

    package = lightning_package()
    base = importlib.import_module(f"{package}.plugins.io").CheckpointIO
    doc = f"{VaultCheckpointIOMixin.__doc__}\n\n    Built on `{package}.plugins.io.CheckpointIO`."
    namespace = {"__module__": __name__, "__doc__": doc, "__qualname__": "VaultCheckpointIO"}
    return type("VaultCheckpointIO", (VaultCheckpointIOMixin, base), namespace)


def __getattr__(name: str) -> Any:
    """`VaultCheckpointIO` on first use, importing Lightning then (PEP 562)."""
    if name != "VaultCheckpointIO":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = _build()
    globals()[name] = value
    return value
