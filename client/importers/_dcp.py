"""Torch Distributed Checkpoint directories: one per step (`step-100/`, `checkpoint_100/`),
each holding `.metadata`, written by the coordinator after every rank's `*.distcp` file
is complete. A directory with shards but no `.metadata` was cut short: reported, never
imported. Each directory becomes one checkpoint of all its files.
"""

from __future__ import annotations

from ._entries import Entry, SourcePath, files_under, problem_in, step_in

METADATA = ".metadata"
SHARD_SUFFIX = ".distcp"


def _is_dcp(directory: SourcePath) -> bool:
    return (directory / METADATA).is_file() or any(directory.glob(f"*{SHARD_SUFFIX}"))


def _dirs(root: SourcePath) -> list[SourcePath]:
    return sorted(p for p in root.iterdir() if p.is_dir() and _is_dcp(p))


def matches(root: SourcePath) -> bool:
    return bool(_dirs(root))


def scan(root: SourcePath) -> list[Entry]:
    entries = []
    for directory in _dirs(root):
        step = step_in(directory.name)
        files = files_under(directory)
        entry = Entry(directory.name, -1 if step is None else step, directory.name, files)
        if step is None:
            entry.problem = f"{directory.name}: no step in its name"
        elif METADATA not in files:
            entry.problem = f"{directory.name}: half-written (no {METADATA})"
        else:
            entry.problem = problem_in(files)
            entry.metadata = {"step": step, "checkpoint_dir": directory.name}
        entries.append(entry)
    return entries
