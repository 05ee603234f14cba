"""What a scanned source is: `Entry`, one checkpoint to be, and the `Scanner` each layout
module provides; plus the few file facts every layout needs (files under a directory, their
mtimes, whether a torch archive is whole).

An entry is decided entirely by the scan, before anything is sent: its files, its step,
its metadata and tags, or the `problem` that keeps it out. So a bad entry is reported (or
stops the import, `strict`) before any checkpoint is committed, never half-way.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol, TypeAlias

from ._remote import RemotePath

SourcePath: TypeAlias = Path | RemotePath  # a local file, or one listed through fsspec

IMPORTED_KEY = "imported"  # metadata key holding where a checkpoint came from
MAX_FILE_MTIMES = 256  # per-file mtimes kept in metadata up to this many files (64 KiB cap)
TORCH_SUFFIXES = frozenset({".pt", ".pth", ".ckpt", ".bin"})  # zip archives when whole

_STEP_WORD = re.compile(r"(?:^|[^A-Za-z])(?:global_step|step|iter|it)[=_-]?(\d+)", re.IGNORECASE)
_DIGITS = re.compile(r"\d+")


@dataclass
class Entry:
    """One checkpoint of a series. `key` names it among the source's entries (a directory
    or file name, or `step-N` for plain files grouped by step): with the source it is what
    an interrupted import looks for in the namespace. `place`: the directory, under the
    export destination, its files go back into ("" for files at the top)."""

    key: str
    step: int
    place: str
    files: dict[str, SourcePath]
    metadata: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    problem: str | None = None

    @property
    def size(self) -> int:
        return sum(p.stat().st_size for p in self.files.values())


class Scanner(Protocol):
    """A layout module: whether a directory looks like its series, and its entries."""

    def matches(self, root: SourcePath) -> bool: ...

    def scan(self, root: SourcePath) -> list[Entry]: ...


def step_in(name: str) -> int | None:
    """The step a file or directory name carries: after `step`/`global_step`/`iter`
    when it says so (`epoch=3-step=1200`), else its last number (`model_1000.pt`)."""
    stem = name.split(".", 1)[0] if not name.startswith(".") else name
    found = _STEP_WORD.findall(stem)
    if found:
        return int(found[-1])
    numbers = _DIGITS.findall(stem)
    return int(numbers[-1]) if numbers else None


def files_under(directory: SourcePath) -> dict[str, SourcePath]:
    """Every regular file below `directory`, by its path relative to it, in name order."""
    out: dict[str, SourcePath] = {}
    if isinstance(directory, RemotePath):
        for remote in sorted(directory.rglob("*")):
            if remote.is_file():
                out[remote.relative_to(directory).as_posix()] = remote
        return out
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            out[path.relative_to(directory).as_posix()] = path
    return out


def unreadable(files: Mapping[str, SourcePath]) -> str | None:
    """Why one of `files` cannot be read (None: all can), checked by opening each."""
    for name, path in files.items():
        try:
            with path.open("rb") as f:
                f.read(1)
        except OSError as e:
            return f"{name}: unreadable ({e.strerror or e})"
    return None


def torch_archive_problem(name: str, path: SourcePath) -> str | None:
    """A torch.save file (zip) cut short has no central directory at its end: reading
    that end record is cheap and catches a file still being written."""
    if path.suffix not in TORCH_SUFFIXES:
        return None
    if path.stat().st_size == 0:
        return f"{name}: empty file"
    with path.open("rb") as f:
        if f.read(4) != b"PK\x03\x04":
            return None  # not a zip archive (legacy torch format, or another kind of file)
        whole = zipfile.is_zipfile(f)  # seeks to the end record: a ranged read when remote
    return None if whole else f"{name}: truncated archive (no zip directory)"


def problem_in(files: Mapping[str, SourcePath]) -> str | None:
    """The first reason one of `files` cannot be imported whole: unreadable, or a torch
    archive cut short."""
    return unreadable(files) or next(
        (p for name, path in files.items() if (p := torch_archive_problem(name, path))), None
    )


def provenance(
    source: SourcePath, layout: str, entry: Entry, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The `imported` metadata of an entry: where it came from (resuming and exporting
    read it) and its files' modification times, which the server's record has no field
    for (its `created_at` is the commit time). A remote file's time is its backend's
    listing's (S3: to the second); one whose backend gives none has no entry."""
    mtimes: dict[str, int] = {}
    for name, path in entry.files.items():
        ns = path.stat().st_mtime_ns
        if ns is not None:
            mtimes[name] = ns
    out: dict[str, Any] = {
        "from": str(source),
        "layout": layout,
        "key": entry.key,
        "place": entry.place,
        "step": entry.step,
    }
    if mtimes:
        newest = max(mtimes.values())
        out["mtime"] = datetime.fromtimestamp(newest / 1e9, timezone.utc).isoformat()
    if len(mtimes) <= MAX_FILE_MTIMES:
        out["mtimes"] = mtimes
    out.update(extra or {})
    return out
