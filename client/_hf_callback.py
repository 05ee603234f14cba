"""`VaultCallback`, the transformers `TrainerCallback` behind `client.hf` (which loads this
module, and transformers, only when the name is first used).

The Trainer calls `on_save` after it has written `checkpoint-<step>/` (model, optimizer,
scheduler, RNG states, trainer_state.json) and rotated older directories away; the
callback reads that directory into memory there, in the training loop, and a
`CheckpointManager` uploads it behind the loop. `on_train_end` waits for the uploads, so
`trainer.train()` returns with every checkpoint committed (or raises the failure).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from .errors import Forbidden
from .hf import checkpoint_dir_name, latest_metrics
from .manager import CheckpointManager, KeepBest, finite_metrics
from .sync import VaultClient

log = logging.getLogger(__name__)


class VaultCallback(TrainerCallback):
    """Push each checkpoint the Trainer saves to `namespace`.

    `keep_last`, `keep_best`, `keep_every_steps` become the namespace's retention rules
    (see `CheckpointManager`); `keep_last` left None takes `save_total_limit` from the
    TrainingArguments, so the vault keeps as many as the Trainer keeps on disk.
    `checked_metrics`: the logged metrics that mark a checkpoint invalid when NaN or
    infinite. `save_on_sigterm=True`: a SIGTERM makes the Trainer save at the end of the
    step under way and stop (the push is waited for). Only the main process pushes: under
    distributed training, rank 0 reads the directory the ranks wrote.
    """

    def __init__(
        self,
        vault: VaultClient,
        namespace: str,
        *,
        keep_last: int | None = None,
        keep_best: KeepBest | None = None,
        keep_every_steps: int | None = None,
        checked_metrics: Sequence[str] = ("loss", "eval_loss"),
        save_on_sigterm: bool = False,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        self.vault = vault
        self.namespace = namespace
        self.keep_last = keep_last
        self.keep_best = keep_best
        self.keep_every_steps = keep_every_steps
        self.checked_metrics = tuple(checked_metrics)
        self.save_on_sigterm = save_on_sigterm
        self.metadata = dict(metadata or {})
        self.manager: CheckpointManager | None = None  # made when training begins

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        """Make the manager (the arguments are known now) and, on a resumed run (the
        Trainer has loaded trainer_state.json), chain the next save onto the checkpoint
        of the step it resumed from."""
        if not state.is_world_process_zero:
            return
        if self.manager is None:
            self.manager = self._manager(args)
        if state.global_step > 0:
            self.manager.follow(state.global_step)

    def _manager(self, args: TrainingArguments) -> CheckpointManager:
        """The run's manager. Keep rules need an admin token: when `keep_last` only comes
        from `save_total_limit` (not asked for here) and the token may not set policies,
        the run goes on without it (logged)."""

        def make(keep_last: int | None) -> CheckpointManager:
            return CheckpointManager(
                self.vault,
                self.namespace,
                keep_last=keep_last,
                keep_best=self.keep_best,
                keep_every_steps=self.keep_every_steps,
                validate=finite_metrics(*self.checked_metrics),
                save_on_sigterm=self.save_on_sigterm,
                metadata=self.metadata,
            )

        if self.keep_last is not None or args.save_total_limit is None:
            return make(self.keep_last)
        try:
            return make(args.save_total_limit)
        except Forbidden as e:
            log.warning("save_total_limit not kept as %s's retention: %s", self.namespace, e)
            return make(None)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        """After a SIGTERM: save at this step's end, then stop training."""
        if self.manager is not None and self.manager.preempted:
            control.should_save = True
            control.should_training_stop = True

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        """Read `checkpoint-<step>/` now and upload it in the background."""
        if self.manager is None:
            return
        name = checkpoint_dir_name(state.global_step)
        self.manager.save(
            state.global_step,
            os.path.join(args.output_dir or ".", name),
            metrics=latest_metrics(state.log_history),
            metadata={"epoch": state.epoch, "checkpoint_dir": name},
        )

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        """Wait for the pushes in flight; give SIGTERM back to its previous handler."""
        if self.manager is not None:
            manager, self.manager = self.manager, None
            manager.close()


__all__ = ["VaultCallback", "latest_metrics"]
