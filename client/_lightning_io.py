"""The body of `client.lightning.VaultCheckpointIO`, without its Lightning base class.

Lightning ships the same code under two packages, `lightning.pytorch` and
`pytorch_lightning`, whose `CheckpointIO` classes are distinct: a Trainer of one accepts
only plugins subclassing its own. `client.lightning` therefore joins this mixin with the
`CheckpointIO` of the package the caller uses when the name is first asked for; this
module needs torch (through client.torch) only when a checkpoint is loaded.

A Lightning checkpoint path (`.../epoch=3-step=20.ckpt`) names a vault checkpoint by its
metadata: each save is a checkpoint of the namespace whose metadata holds `path` (the path
as given, made absolute), `step` (the trainer's global step) and `epoch`, with one file,
state.pt (`torch.save` of the checkpoint dict, as Lightning's own TorchCheckpointIO
writes). Saving a path again replaces the checkpoint of that path, as a file would be
overwritten; removing a path deletes its checkpoints.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from typing import Any

from .errors import NotFound
from .manager import STATE_FILE, CheckpointManager
from .models import Checkpoint
from .sync import VaultClient


class VaultCheckpointIOMixin:
    """`save_checkpoint`, `load_checkpoint`, `remove_checkpoint`, `teardown` of a Lightning
    `CheckpointIO` that keeps checkpoints in a vault namespace.

    Saves run in the background (a `CheckpointManager`): `save_checkpoint` returns once
    the tensors are copied to fresh CPU memory. Wrapped in Lightning's
    `AsyncCheckpointIO`, the copy and upload both leave the training loop: the plugin,
    called from the wrapper's worker thread, commits each save before returning, as the
    wrapper's teardown waits for its thread only (`background` True or False overrides
    the choice by thread). A removal that reaches this object before the save it undoes
    has run (the wrapper queues saves, not removals) cancels that save instead.
    """

    def __init__(
        self, vault: VaultClient, namespace: str, *, background: bool | None = None
    ) -> None:
        super().__init__()
        self.vault = vault
        self.namespace = namespace
        self.background = background
        self.manager = CheckpointManager(vault, namespace)
        self._lock = threading.Lock()
        self._saves: Counter[str] = Counter()  # saves begun per path, not yet removed
        self._cancelled: Counter[str] = Counter()  # removals that came before their save

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike[str], storage_options: Any = None
    ) -> None:
        """Save `checkpoint` as the vault checkpoint of `path` (`storage_options` are for
        fsspec file systems and are not used)."""
        key = path_key(path)
        with self._lock:  # a removal of the same path waits, or is waited for
            if self._cancelled[key]:
                self._cancelled[key] -= 1
                return
            if self._saves[key]:  # the older checkpoint goes, as a file's old bytes would
                self._delete(key)
            self._saves[key] += 1
            handle = self.manager.save(
                int(checkpoint.get("global_step", 0)),
                state=checkpoint,
                metadata={"path": key, "epoch": checkpoint.get("epoch")},
            )
        if not self._in_background():
            handle.result()

    def _in_background(self) -> bool:
        """`background` None: in the background when called from the main thread (the
        training loop), else committed before returning: called from AsyncCheckpointIO's
        worker, whose teardown waits for that thread only, not for this plugin's uploads."""
        if self.background is not None:
            return self.background
        return threading.current_thread() is threading.main_thread()

    def load_checkpoint(
        self,
        path: str | os.PathLike[str],
        map_location: Any = None,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """The checkpoint dict saved for `path`. `weights_only` None loads with
        `weights_only=False`, as Lightning does for checkpoints not on local disk: a
        checkpoint holds hyper-parameters and callback states besides tensors."""
        from .torch import load_state_dict

        found = self.find(path)
        if found is None:
            raise FileNotFoundError(f"no checkpoint of {path} in vault namespace {self.namespace}")
        state = load_state_dict(
            self.vault,
            self.namespace,
            found.id,
            name=STATE_FILE,
            map_location=map_location,
            weights_only=bool(weights_only),
        )
        if not isinstance(state, dict):
            raise TypeError(f"checkpoint of {path} holds a {type(state).__name__}, not a dict")
        return state

    def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Delete the checkpoints of `path` (ModelCheckpoint's top-k removals), those of an
        earlier run resumed from included. A path with no checkpoint yet is one whose
        save is still queued (AsyncCheckpointIO): that save is dropped when it comes."""
        key = path_key(path)
        with self._lock:
            saved = self._saves.pop(key, 0) > 0
            if not self._delete(key) and not saved:
                self._cancelled[key] += 1

    def teardown(self) -> None:
        """Wait for the saves in flight (raising a failed one)."""
        self.manager.wait()

    def find(self, path: str | os.PathLike[str]) -> Checkpoint | None:
        """The newest live checkpoint saved for `path`, once the saves in flight are in."""
        self.manager.wait()
        key = path_key(path)
        return next((c for c in self._all() if c.metadata.get("path") == key), None)

    def _delete(self, key: str) -> int:
        """Delete the live checkpoints of path `key`, once the saves in flight are in;
        answers how many there were."""
        self.manager.wait()
        ids = [c.id for c in self._all() if c.metadata.get("path") == key]
        if ids:
            self.vault.delete_many(self.namespace, ids)
        return len(ids)

    def _all(self) -> list[Checkpoint]:
        """Every live checkpoint of the namespace, newest first."""
        out: list[Checkpoint] = []
        before: str | None = None
        while True:
            try:
                page = self.vault.list(self.namespace, limit=1000, before=before)
            except NotFound:
                return out
            out.extend(page)
            if len(page) < 1000:
                return out
            before = page[-1].id


def path_key(path: str | os.PathLike[str]) -> str:
    """How a path is recorded: absolute and normalised, so `ckpt/a.ckpt` and
    `./ckpt/a.ckpt` name the same checkpoint (URLs such as s3://... are kept as given)."""
    text = os.fspath(path)
    return text if "://" in text else os.path.abspath(text)
