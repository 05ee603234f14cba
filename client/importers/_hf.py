"""Hugging Face Trainer output directories: `checkpoint-<step>/` each, written by
`Trainer._save_checkpoint` with `trainer_state.json` last but for the RNG state, so a
directory without it was cut short (a killed job) and is not a checkpoint.

Each directory becomes one checkpoint with the metadata `VaultCallback` gives a pushed
one (`step`, `epoch`, `checkpoint_dir` and the newest value of each logged metric, so
`resume_from_vault` and keep-best rules read imported and pushed runs alike); the newest
state's `best_model_checkpoint` is tagged `best`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..hf import latest_metrics
from ..manager import metric_value
from ._entries import Entry, SourcePath, files_under, problem_in

NAME = re.compile(r"checkpoint-(\d+)")
STATE_FILE = "trainer_state.json"
BEST_TAG = "best"


def _dirs(root: SourcePath) -> list[SourcePath]:
    return sorted(p for p in root.iterdir() if p.is_dir() and NAME.fullmatch(p.name))


def matches(root: SourcePath) -> bool:
    """`checkpoint-N/` directories, at least one with a trainer state (a series of only
    half-written ones is still this layout: each is then reported)."""
    found = _dirs(root)
    return any((d / STATE_FILE).is_file() for d in found) or (
        bool(found) and not any((d / ".metadata").is_file() for d in found)
    )


def _state(directory: SourcePath) -> tuple[dict[str, Any] | None, str | None]:
    """The directory's trainer state, or why there is none usable."""
    path = directory / STATE_FILE
    if not path.is_file():
        return None, f"{directory.name}: half-written (no {STATE_FILE})"
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return None, f"{directory.name}: unreadable {STATE_FILE} ({e})"
    if not isinstance(state, dict):
        return None, f"{directory.name}: {STATE_FILE} is not an object"
    return state, None


def _metadata(name: str, step: int, state: dict[str, Any]) -> dict[str, Any]:
    history = state.get("log_history") or []
    metrics = latest_metrics([e for e in history if isinstance(e, dict)])
    md: dict[str, Any] = {"step": step, "epoch": state.get("epoch"), "checkpoint_dir": name}
    md.update({k: metric_value(v) for k, v in metrics.items()})
    for key in ("best_model_checkpoint", "best_metric", "best_global_step"):
        if state.get(key) is not None:
            md[key] = state[key]
    return md


def scan(root: SourcePath) -> list[Entry]:
    entries = []
    for directory in _dirs(root):
        match = NAME.fullmatch(directory.name)
        assert match is not None  # _dirs keeps only these names
        step = int(match.group(1))
        files = files_under(directory)
        entry = Entry(directory.name, step, directory.name, files)
        state, entry.problem = _state(directory)
        if state is not None:
            step = int(state.get("global_step") or step)
            entry.step = step
            entry.metadata = _metadata(directory.name, step, state)
            entry.problem = problem_in(files)
        entries.append(entry)
    _tag_best(entries)
    return entries


def _tag_best(entries: list[Entry]) -> None:
    """Tag the checkpoint the newest trainer state calls best (its path's last part names
    a directory of this series)."""
    good = [e for e in entries if e.problem is None]
    if not good:
        return
    best = max(good, key=lambda e: e.step).metadata.get("best_model_checkpoint")
    if not isinstance(best, str):
        return
    name = Path(best).name
    for entry in good:
        if entry.key == name:
            entry.tags.append(BEST_TAG)
