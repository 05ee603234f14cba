"""Lightning `ModelCheckpoint` dirpaths: `*.ckpt` files named from `filename`'s template,
by default `epoch=E-step=S.ckpt` (`-vN` added on a name clash). Each file with a step in
its name is one checkpoint; `last.ckpt` and other names without one are reported and left
out (a copy of a stepped save, with no place in the step order).

The best model is read from the newest file's callback state: `ModelCheckpoint` saves
its `best_model_path`, `best_model_score`, `monitor` and `best_k_models` into every
checkpoint it writes. The file is loaded with `weights_only=True` (no pickled code runs:
an imported directory may come from anywhere) and memory-mapped (a remote one is read
through instead); when that cannot read
it, the import goes on without a best tag and says so.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..manager import metric_value
from ._entries import Entry, SourcePath, problem_in, step_in

SUFFIX = ".ckpt"
EPOCH = re.compile(r"epoch[=_-]?(\d+)")
BEST_TAG = "best"
CALLBACK_PREFIX = "ModelCheckpoint"


def _files(root: SourcePath) -> list[SourcePath]:
    return sorted(p for p in root.iterdir() if p.is_file() and p.suffix == SUFFIX)


def matches(root: SourcePath) -> bool:
    return any(step_in(p.name) is not None for p in _files(root))


def scan(root: SourcePath) -> list[Entry]:
    entries = []
    for path in _files(root):
        step = step_in(path.name)
        entry = Entry(path.name, step if step is not None else -1, "", {path.name: path})
        if step is None:
            entry.problem = f"{path.name}: no step in its name"
        else:
            entry.problem = problem_in(entry.files)
            epoch = EPOCH.search(path.name)
            entry.metadata = {"step": step, "path": path.name}
            if epoch:
                entry.metadata["epoch"] = int(epoch.group(1))
        entries.append(entry)
    good = [e for e in entries if e.problem is None]
    if good:
        newest = max(good, key=lambda e: (e.step, e.key))
        _mark_best(root, good, _checkpoint_state(newest.files[newest.key]))
    return entries


def _checkpoint_state(path: SourcePath) -> dict[str, Any] | None:
    """The `ModelCheckpoint` state saved in `path` (the one whose dirpath is this
    directory when several), or None when unreadable without running pickled code."""
    import torch

    try:
        if isinstance(path, Path):
            ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        else:  # a remote file cannot be mapped: read through, seeking as torch asks
            with path.open("rb") as f:
                ckpt = torch.load(f, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - any load failure means: no best to read
        return None
    callbacks = ckpt.get("callbacks") if isinstance(ckpt, dict) else None
    if not isinstance(callbacks, dict):
        return None
    states = [
        s
        for k, s in callbacks.items()
        if str(k).startswith(CALLBACK_PREFIX) and isinstance(s, dict) and s.get("best_model_path")
    ]
    here = [s for s in states if _same_dir(s.get("dirpath"), path.parent)]
    chosen = here or states
    return chosen[0] if chosen else None


def _same_dir(dirpath: Any, directory: SourcePath) -> bool:
    if not isinstance(directory, Path):  # a URL, or the bucket path it names
        return isinstance(dirpath, str) and dirpath.rstrip("/") in (str(directory), directory.path)
    try:
        return isinstance(dirpath, str) and Path(dirpath).resolve() == directory.resolve()
    except OSError:
        return False


def _score(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _mark_best(root: SourcePath, entries: list[Entry], state: dict[str, Any] | None) -> None:
    """Tag the best entry; give each top-k entry its monitored score."""
    if state is None:
        return
    monitor = state.get("monitor")
    scores = {Path(str(p)).name: _score(v) for p, v in (state.get("best_k_models") or {}).items()}
    best = Path(str(state.get("best_model_path"))).name
    for entry in entries:
        score = scores.get(entry.key)
        if isinstance(monitor, str) and score is not None:
            entry.metadata[monitor] = metric_value(score)
        if entry.key == best:
            entry.tags.append(BEST_TAG)
            best_score = _score(state.get("best_model_score"))
            if best_score is not None:
                entry.metadata["best_model_score"] = metric_value(best_score)
            if isinstance(monitor, str):
                entry.metadata["monitor"] = monitor
