"""`CheckpointManager`: when to save, what to keep and what to resume from, for any loop.

    from checkpoint_vault.client import CheckpointManager, VaultClient
    from checkpoint_vault.client.manager import KeepBest
    with VaultClient() as vault, CheckpointManager(
        vault, "runs/exp1", every_steps=100, keep_last=3, keep_best=KeepBest("loss", "min", 2)
    ) as manager:
        start = manager.latest_step() or 0
        manager.restore(dest="ckpt/")                  # latest valid checkpoint, if any
        for step in range(start + 1, steps + 1):
            loss = train_step()
            if manager.should_save(step):
                manager.save(step, "ckpt/", metrics={"loss": loss})
            if manager.preempted:                      # SIGTERM, with save_on_sigterm=True
                break

Orbax's CheckpointManager shaped the interface (cadence, keep policy, restore the latest
good one); the vault changes what each part costs. Keep rules are not enforced by the
manager deleting files: they become the namespace's retention policy on the server, where
`ckpt retention plan` shows them and the server's retention applies them (or `prune()`,
with an admin token, at once). Saves run in the background as `VaultClient`'s do: the loop
is blocked only while the files are read (or the tensors copied), and each save names the
one before it as parent, so the namespace holds one chain per run, in step order, even
with several saves in flight. A `validate` callable sees each committed checkpoint and
marks it valid or invalid; `restore()` never picks an invalid one.

Everything heavy stays out: torch is imported only when a save is given a `state`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, Literal

from .background import BackgroundSaveFailed, SaveHandle, snapshot_files
from .chunking import FileSpec
from .errors import ClientError, NotFound
from .models import Checkpoint
from .options import SaveFields
from .sync import VaultClient

log = logging.getLogger(__name__)

__all__ = ["CheckpointManager", "KeepBest", "Validator", "finite_metrics"]

Validator = Callable[[Checkpoint], "bool | str"]
"""Called with each committed checkpoint (its metadata holds `step` and the metrics):
True marks it valid; False or a reason (a string) marks it invalid."""

STATE_FILE = "state.pt"  # the file a `state` save writes (torch.save of the state)
NON_FINITE = frozenset({"nan", "inf", "-inf"})  # how non-finite metrics are stored


@dataclass(frozen=True)
class KeepBest:
    """Keep the `n` checkpoints best by `metric` (a metric passed to `save`)."""

    metric: str
    mode: Literal["min", "max"] = "min"
    n: int = 1


def finite_metrics(*names: str) -> Validator:
    """A validator that marks a checkpoint invalid when one of the metrics `names` (all
    of them when none is named) was NaN or infinite, valid otherwise."""

    def validate(checkpoint: Checkpoint) -> bool | str:
        keys = names or tuple(checkpoint.metadata)
        for key in keys:
            value = checkpoint.metadata.get(key)
            if value in NON_FINITE:
                return f"{key} is {value}"
        return True

    return validate


def metric_value(value: float) -> float | str:
    """A metric as metadata holds it: JSON has no NaN or infinity (the server refuses
    them), so those are kept as the strings "nan", "inf", "-inf"."""
    value = float(value)
    if math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


class CheckpointManager:
    """Saves of one training run into `namespace`: cadence, keep rules, validity, resume.

    Cadence: `should_save(step)` is true every `every_steps` steps, once `every_seconds`
    have passed since the last save, and after a SIGTERM (`save_on_sigterm=True`).
    Keep rules (`keep_last`, `keep_best`, `keep_every_steps`) are set on the namespace's
    retention policy when the manager is made; other rules already there stay.
    `keep_every_steps=K` tags each checkpoint whose step is a multiple of K `every-K` and
    keeps that tag. `background=False` makes each `save` return once committed.
    `save_on_sigterm=True` installs a SIGTERM handler, so the manager must then be made
    in the main thread (Python runs signal handlers there only).
    """

    def __init__(
        self,
        vault: VaultClient,
        namespace: str,
        *,
        every_steps: int | None = None,
        every_seconds: float | None = None,
        keep_last: int | None = None,
        keep_best: KeepBest | None = None,
        keep_every_steps: int | None = None,
        validate: Validator | None = None,
        background: bool = True,
        save_on_sigterm: bool = False,
        metadata: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for name, n in (("every_steps", every_steps), ("keep_every_steps", keep_every_steps)):
            if n is not None and n < 1:
                raise ValueError(f"{name} must be at least 1, not {n}")
        self.vault = vault
        self.namespace = namespace
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self.keep_every_steps = keep_every_steps
        self.validate = validate
        self.background = background
        self.metadata = dict(metadata or {})
        self._clock = clock
        self._last_time = clock()
        self._last_step: int | None = None
        self._lock = threading.Lock()
        self._handles: list[SaveHandle] = []
        self._tail: concurrent.futures.Future[None] | None = None  # the newest save's end
        self._parent: str | None = None  # the newest committed checkpoint of this run
        self._parent_known = False  # False: the first save chains onto the namespace's latest
        self.preempted = False
        self.policy_error: ClientError | None = None  # why the keep rules could not be set
        self._previous_handler: Any = None
        self._pending_rules: dict[str, Any] | None = (
            self._rules(keep_last, keep_best, keep_every_steps) or None
        )
        if self._pending_rules is not None:
            try:
                kept = vault.policy(namespace).retention.keep_tags
            except NotFound:
                pass  # no namespace yet: the first save sets them
            else:
                vault.set_policy(namespace, {"retention": self._merged(kept)})
                self._pending_rules = None
        if save_on_sigterm:
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)

    # -- cadence ----------------------------------------------------------------------
    def should_save(self, step: int) -> bool:
        """Whether `step` is due for a save (never the step saved last)."""
        if self.preempted:
            return True
        if step == self._last_step:
            return False
        if self.every_steps is not None and step % self.every_steps == 0:
            return True
        return self.every_seconds is not None and (
            self._clock() - self._last_time >= self.every_seconds
        )

    # -- saving -----------------------------------------------------------------------
    def save(
        self,
        step: int,
        files: FileSpec | Mapping[str, FileSpec] | None = None,
        *,
        state: Any = None,
        metrics: Mapping[str, float] | None = None,
        metadata: Mapping[str, Any] | None = None,
        tags: Sequence[str] = (),
    ) -> SaveHandle:
        """Save `files` (a directory, or name -> path/bytes/file) or a torch `state`
        (written as state.pt) as the checkpoint of `step`, child of this run's previous one.

        Returns once the files are read (or the tensors copied); the handle's `result()`
        gives the checkpoint, validated when a `validate` was given. After a SIGTERM the
        save is waited for before returning, as the process is about to be stopped."""
        if (files is None) == (state is None):
            raise TypeError("save takes files or a state, exactly one of them")
        preemption = self.preempted
        fields = self._fields(step, metrics, {**(metadata or {}), **self._preempted()}, tags)

        def prepare() -> Coroutine[Any, Any, Checkpoint]:
            return self._upload(self._snapshot(files, state), fields, self._chain())

        handle = self.vault.submit(prepare)
        with self._lock:
            self._handles.append(handle)
        self._last_step = step
        self._last_time = self._clock()
        if preemption or not self.background:
            handle.result()
        return handle

    def wait(self) -> None:
        """Wait for this manager's saves in flight; raise `BackgroundSaveFailed` with the
        errors of those that failed (each is raised once)."""
        with self._lock:
            handles, self._handles = self._handles, []
        errors = [e for h in handles if (e := h.exception()) is not None]
        if errors:
            raise BackgroundSaveFailed(errors)

    # -- resuming ---------------------------------------------------------------------
    def latest_step(self) -> int | None:
        """The step of the newest checkpoint not marked invalid (None: there is none)."""
        self.wait()
        try:
            checkpoint = self.vault.get(self.namespace, "latest-valid")
        except NotFound:
            return None
        return _step_of(checkpoint)

    def restore(self, step: int | None = None, dest: str = ".") -> Checkpoint | None:
        """Write the checkpoint of `step` (None: the newest not marked invalid) under
        `dest` and return it; None when the namespace has none. The run's next save
        follows it in the lineage. A `step` saved only in checkpoints marked invalid, or
        never saved, raises `NotFound`."""
        self.wait()
        if step is None:
            ref = "latest-valid"
        else:
            found = self._find_step(step)
            if found is None:
                raise NotFound(f"no valid checkpoint of step {step} in {self.namespace}")
            ref = found.id
        try:
            checkpoint = self.vault.load(self.namespace, ref, dest)
        except NotFound:
            if step is not None:
                raise
            return None
        with self._lock:
            self._parent, self._parent_known = checkpoint.id, True
        self._last_step = _step_of(checkpoint)
        return checkpoint

    def follow(self, step: int) -> Checkpoint | None:
        """Go on from the checkpoint of `step` (the newest not marked invalid), already
        restored by other means (the Trainer reading the directory `resume_from_vault`
        pulled): the run's next save is its child. None, and no change, if there is none."""
        self.wait()
        found = self._find_step(step)
        if found is not None:
            with self._lock:
                self._parent, self._parent_known = found.id, True
            self._last_step = step
        return found

    def prune(self) -> list[str]:
        """Apply the namespace's retention now (needs an admin token) rather than at the
        server's next retention run; answers the ids deleted."""
        self.wait()
        return list(self.vault.retention(dry_run=False, namespace=self.namespace).deleted)

    def close(self) -> None:
        """Wait for the saves in flight and give SIGTERM back to its previous handler."""
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None
        self.wait()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------
    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        """Only a flag: the loop saves at its next `should_save`, between steps, where the
        state is whole (a save from inside the handler could catch a half-done update)."""
        self.preempted = True

    def _rules(
        self, keep_last: int | None, keep_best: KeepBest | None, every: int | None
    ) -> dict[str, Any]:
        """The retention rules asked for, as the policy's wire keys."""
        rules: dict[str, Any] = {}
        if keep_last is not None:
            rules["keep_last"] = keep_last
        if keep_best is not None:
            best = {"metric": keep_best.metric, "mode": keep_best.mode, "n": keep_best.n}
            rules["keep_best"] = best
        if every is not None:
            rules["keep_tags"] = [_every_tag(every)]
        return rules

    async def _push_policy(self) -> None:
        """Set the keep rules on the namespace's policy (keeping the tags it already
        keeps). A namespace exists from its first checkpoint on: before that the server
        has no policy to change, and the rules go on with the first save."""
        if self._pending_rules is None:
            return
        aio = self.vault.aio
        kept = (await aio.policy(self.namespace)).retention.keep_tags
        await aio.set_policy(self.namespace, {"retention": self._merged(kept)})
        self._pending_rules = None

    async def _push_policy_or_warn(self) -> None:
        """After a commit the checkpoint is saved whatever the policy does: a refusal (a
        token without the admin scope) is logged and kept in `policy_error`, not raised."""
        try:
            await self._push_policy()
        except ClientError as e:
            self._pending_rules = None
            self.policy_error = e
            log.warning("keep rules not set on %s: %s", self.namespace, e)

    def _merged(self, kept: Sequence[str]) -> dict[str, Any]:
        """The rules to set: a `keep_tags` rule adds to the tags already kept."""
        rules = dict(self._pending_rules or {})
        if "keep_tags" in rules:
            rules["keep_tags"] = sorted({*kept, *rules["keep_tags"]})
        return rules

    def _preempted(self) -> dict[str, Any]:
        return {"preempted": True} if self.preempted else {}

    def _fields(
        self,
        step: int,
        metrics: Mapping[str, float] | None,
        metadata: Mapping[str, Any] | None,
        tags: Sequence[str],
    ) -> SaveFields:
        meta: dict[str, Any] = {**self.metadata, **(metadata or {}), "step": step}
        meta.update({k: metric_value(v) for k, v in (metrics or {}).items()})
        all_tags = list(tags)
        if self.keep_every_steps is not None and step % self.keep_every_steps == 0:
            all_tags.append(_every_tag(self.keep_every_steps))
        return {"metadata": meta, "tags": all_tags}

    def _snapshot(self, files: FileSpec | Mapping[str, FileSpec] | None, state: Any) -> Any:
        """In the caller's thread: the copy the upload sends (file bytes, or tensors in
        fresh CPU memory)."""
        if files is not None:
            return snapshot_files(files)
        from .torch import snapshot  # torch only for a state save

        return _StateCopy(snapshot(state))

    def _chain(
        self,
    ) -> tuple[concurrent.futures.Future[None] | None, concurrent.futures.Future[None]]:
        """The end of the save before this one, and this one's, to wait on in turn."""
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._lock:
            before, self._tail = self._tail, done
        return before, done

    async def _upload(
        self,
        copy: Any,
        fields: SaveFields,
        chain: tuple[concurrent.futures.Future[None] | None, concurrent.futures.Future[None]],
    ) -> Checkpoint:
        """On the client's loop: wait for the previous save to end (its checkpoint is this
        one's parent), upload, validate. The next save waits for this one however it ends."""
        before, done = chain
        try:
            if before is not None:
                await asyncio.wrap_future(before)
            if isinstance(copy, _StateCopy):
                copy = {STATE_FILE: await asyncio.to_thread(copy.serialize)}
            parent = await self._parent_id()
            try:
                checkpoint = await self._commit(copy, fields, parent)
            except NotFound:
                if parent is None:
                    raise
                # the previous checkpoint was deleted meanwhile (Lightning's top-k removes
                # the one just saved when it ranks last): follow the newest one left
                parent = await self._latest_id()
                checkpoint = await self._commit(copy, fields, parent)
            with self._lock:
                self._parent = checkpoint.id
            await self._push_policy_or_warn()
            if self.validate is not None:
                checkpoint = await self._mark(checkpoint)
            return checkpoint
        finally:
            done.set_result(None)

    async def _parent_id(self) -> str | None:
        with self._lock:
            if self._parent_known:
                return self._parent
        latest = await self._latest_id()
        with self._lock:
            if not self._parent_known:
                self._parent, self._parent_known = latest, True
            return self._parent

    async def _commit(self, copy: Any, fields: SaveFields, parent: str | None) -> Checkpoint:
        return await self.vault.aio.save(
            self.namespace,
            copy,
            parent=parent,
            metadata=fields.get("metadata"),
            tags=fields.get("tags"),
        )

    async def _latest_id(self) -> str | None:
        try:
            return (await self.vault.aio.get(self.namespace, "latest")).id
        except NotFound:
            return None

    async def _mark(self, checkpoint: Checkpoint) -> Checkpoint:
        assert self.validate is not None
        verdict = await asyncio.to_thread(self.validate, checkpoint)
        aio = self.vault.aio
        if verdict is True:
            return await aio.mark_valid(self.namespace, checkpoint.id)
        reason = verdict if isinstance(verdict, str) else "rejected by validate"
        return await aio.mark_invalid(self.namespace, checkpoint.id, reason)

    def _find_step(self, step: int) -> Checkpoint | None:
        """The newest checkpoint of `step` not marked invalid."""
        for checkpoint in self._checkpoints():
            if _step_of(checkpoint) == step and checkpoint.valid is not False:
                return checkpoint
        return None

    def _checkpoints(self) -> Iterator[Checkpoint]:
        """Every live checkpoint of the namespace, newest first, page by page."""
        before: str | None = None
        while True:
            page = self.vault.list(self.namespace, limit=1000, before=before)
            yield from page
            if len(page) < 1000:
                return
            before = page[-1].id


class _StateCopy:
    """A torch state copied to CPU memory, serialized on a worker thread by the upload."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def serialize(self) -> bytes:
        import torch

        buf = io.BytesIO()
        torch.save(self.state, buf)
        return buf.getvalue()


def _every_tag(every: int) -> str:
    return f"every-{every}"


def _step_of(checkpoint: Checkpoint) -> int | None:
    step = checkpoint.metadata.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None
