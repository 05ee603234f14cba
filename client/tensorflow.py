"""TensorFlow checkpoints into the vault: `VaultCheckpointManager`, shaped like
`tf.train.CheckpointManager`, with no S3 plugin or filesystem in between.

    from checkpoint_vault.client import VaultClient
    from checkpoint_vault.client.tensorflow import VaultCheckpointManager
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer)
    manager = VaultCheckpointManager(ckpt, VaultClient(), "runs/tf-exp1", max_to_keep=3)
    manager.restore_or_initialize()          # resumes from the newest checkpoint, if any
    ...
    manager.save()                           # one vault checkpoint: ckpt-N.index, .data-*

Each `save` writes the `tf.train.Checkpoint` (`Checkpoint.write`, TensorFlow's own
format: an index and data shards) into a private temporary directory, saves those files
as one checkpoint of the namespace, the child of the newest one, with `step` (the
checkpoint number) and `prefix` in its metadata, and removes the directory. `restore`
loads a checkpoint's files into a directory kept until the next restore or `close` (TF
restores variables created later, such as optimizer slots, from the files then) and reads
it back with `Checkpoint.read`. `max_to_keep` deletes the oldest unpinned checkpoints of
the namespace past that many, as TF's manager deletes old files (the token needs
`delete:` for that; None keeps everything: use a retention policy instead).

Importing this module does not import TensorFlow; the manager works on any object with
`write(prefix)` and `read(prefix)` returning a status, which `tf.train.Checkpoint` is.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Protocol

from .errors import NotFound
from .models import Checkpoint
from .sync import VaultClient

__all__ = ["VaultCheckpointManager"]


class Checkpointable(Protocol):
    """What the manager needs of a `tf.train.Checkpoint`."""

    def write(self, file_prefix: str) -> str: ...
    def read(self, save_path: str) -> Any: ...


class VaultCheckpointManager:
    """`tf.train.CheckpointManager`'s save / restore / latest_checkpoint, into the vault."""

    def __init__(
        self,
        checkpoint: Checkpointable,
        vault: VaultClient,
        namespace: str,
        max_to_keep: int | None = 5,
        checkpoint_name: str = "ckpt",
        step_counter: Any = None,
    ) -> None:
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError("max_to_keep must be at least 1, or None to keep every one")
        self._checkpoint = checkpoint
        self._vault = vault
        self.namespace = namespace
        self.max_to_keep = max_to_keep
        self.checkpoint_name = checkpoint_name
        self._step_counter = step_counter
        self._restored: tempfile.TemporaryDirectory[str] | None = None

    @property
    def latest_checkpoint(self) -> str | None:
        """The id of the namespace's newest checkpoint, or None (a fresh run)."""
        try:
            return self._vault.get(self.namespace, "latest").id
        except NotFound:
            return None

    @property
    def checkpoints(self) -> list[str]:
        """The namespace's checkpoint ids, oldest first (TF's manager lists its paths so)."""
        try:
            return [c.id for c in reversed(self._vault.list(self.namespace, limit=1000))]
        except NotFound:
            return []

    def _number(self, checkpoint_number: int | None) -> int:
        if checkpoint_number is not None:
            return int(checkpoint_number)
        if self._step_counter is not None:
            return int(self._step_counter.numpy())
        latest = self._latest()
        step = latest.metadata.get("step") if latest is not None else None
        return step + 1 if isinstance(step, int) else 1

    def _latest(self) -> Checkpoint | None:
        try:
            return self._vault.get(self.namespace, "latest")
        except NotFound:
            return None

    def save(self, checkpoint_number: int | None = None) -> str:
        """Write the checkpoint and save it to the vault; returns the new checkpoint's id."""
        number = self._number(checkpoint_number)
        prefix = f"{self.checkpoint_name}-{number}"
        parent = self._latest()
        with tempfile.TemporaryDirectory(prefix="ckpt-tf-") as tmp:
            self._checkpoint.write(str(Path(tmp) / prefix))
            files = {p.name: p for p in sorted(Path(tmp).iterdir()) if p.is_file()}
            saved = self._vault.save(
                self.namespace,
                files,
                parent=parent.id if parent is not None else None,
                metadata={"step": number, "prefix": prefix, "framework": "tensorflow"},
            )
        self._sweep()
        return saved.id

    def _sweep(self) -> None:
        """Delete the oldest unpinned checkpoints past `max_to_keep`."""
        if self.max_to_keep is None:
            return
        listed = self._vault.list(self.namespace, limit=1000)  # newest first
        for old in listed[self.max_to_keep :]:
            if not old.pinned:
                self._vault.delete(self.namespace, old.id)

    def restore(self, ref: str = "latest") -> Any:
        """Restore checkpoint `ref` (an id, `latest` or `latest-valid`) into the tracked
        objects; returns TF's load status (`assert_consumed()` and friends)."""
        record = self._vault.get(self.namespace, ref)
        self.close()
        self._restored = tempfile.TemporaryDirectory(prefix="ckpt-tf-restore-")
        self._vault.load(self.namespace, record.id, self._restored.name)
        prefix = record.metadata.get("prefix")
        if not isinstance(prefix, str) or "/" in prefix:
            raise ValueError(f"checkpoint {record.id} was not saved by VaultCheckpointManager")
        return self._checkpoint.read(str(Path(self._restored.name) / prefix))

    def restore_or_initialize(self) -> str | None:
        """Restore the newest checkpoint and return its id; None when there is none."""
        latest = self.latest_checkpoint
        if latest is None:
            return None
        self.restore(latest)
        return latest

    def close(self) -> None:
        """Remove the files of the last restore (variables created since have read them)."""
        if self._restored is not None:
            self._restored.cleanup()
            self._restored = None
