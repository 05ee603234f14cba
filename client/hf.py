"""Hugging Face `Trainer` runs into the vault: one callback to push, one call to resume.

    from checkpoint_vault.client import VaultClient
    from checkpoint_vault.client.hf import VaultCallback, resume_from_vault
    vault = VaultClient()
    trainer = Trainer(model, args, train_dataset=data,
                      callbacks=[VaultCallback(vault, "runs/gpt2-ft", keep_last=3)])
    resume = resume_from_vault(vault, "runs/gpt2-ft", dest=args.output_dir)  # None: fresh
    trainer.train(resume_from_checkpoint=resume)

Each `checkpoint-<step>/` directory the Trainer writes becomes one checkpoint, the child
of the one before, with `step`, `epoch` and the latest logged metrics in its metadata;
a NaN or infinite loss marks it invalid, so `resume_from_vault` (ref "latest-valid")
never resumes from it. Accelerate's `save_state` directories go through
`CheckpointManager.save(step, directory)` and `restore(dest=...)` the same way
(docs/integrations/hf.md).

Importing this module is light: `VaultCallback` (which subclasses transformers'
`TrainerCallback`) and transformers with it load on first use of the name, and
`resume_from_vault` needs neither.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import NotFound
from .sync import VaultClient

if TYPE_CHECKING:
    from ._hf_callback import VaultCallback

__all__ = [
    "VaultCallback",
    "checkpoint_dir_name",
    "latest_metrics",
    "resume_from_vault",
]

SKIPPED_LOG_KEYS = frozenset({"step", "epoch"})  # in every log entry; the record has them


def checkpoint_dir_name(step: int) -> str:
    """The Trainer's directory name for the checkpoint of `step`
    (transformers' PREFIX_CHECKPOINT_DIR, "checkpoint", and the step)."""
    return f"checkpoint-{step}"


def latest_metrics(log_history: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The newest logged value of each numeric metric (loss, eval_loss, learning_rate...),
    NaN and infinities included: they are what marks a checkpoint invalid."""
    out: dict[str, float] = {}
    for entry in reversed(log_history):
        for key, value in entry.items():
            if key in SKIPPED_LOG_KEYS or key in out:
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[key] = float(value)
    return out


def resume_from_vault(
    vault: VaultClient, namespace: str, dest: str | Path, ref: str = "latest-valid"
) -> str | None:
    """Pull checkpoint `ref` of `namespace` into `dest/checkpoint-<step>/` and return
    that directory, for `trainer.train(resume_from_checkpoint=...)`; None when the
    namespace has no such checkpoint (a fresh run: `resume_from_checkpoint=None`)."""
    try:
        checkpoint = vault.get(namespace, ref)
    except NotFound:
        return None
    name = checkpoint.metadata.get("checkpoint_dir")
    if not isinstance(name, str) or "/" in name or name in ("", ".", ".."):
        step = checkpoint.metadata.get("step")
        name = checkpoint_dir_name(step) if isinstance(step, int) else checkpoint.id
    target = Path(dest) / name
    vault.load(namespace, checkpoint.id, target)
    return str(target)


def __getattr__(name: str) -> Any:
    """`VaultCallback` on first use, importing transformers then (PEP 562)."""
    if name != "VaultCallback":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = importlib.import_module("._hf_callback", __package__).VaultCallback
    globals()[name] = value
    return value
