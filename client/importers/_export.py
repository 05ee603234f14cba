"""Exporting a namespace back to a directory series, oldest checkpoint first.

An imported checkpoint goes back where its `imported` metadata says it came from
(`checkpoint-500/`, `epoch=3-step=1200.ckpt` at the top, ...) with its files'
modification times, so exporting an import gives the source directory back byte for
byte; importing that again gives the same metadata. A checkpoint pushed by `VaultCallback`
goes to its `checkpoint_dir`; any other, or all with `plain`, to `step-<step>/` (or
`<id>/` without a step). Places come from metadata others may have written: one that is
absolute or climbs out of the destination is refused.

Exporting again after an interruption skips the checkpoints whose files are all there
with their sizes (a load writes each file under a temporary name and renames it whole).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ..models import Checkpoint
from ..progress import Progress
from ..sync import VaultClient
from ._entries import IMPORTED_KEY

LIST_PAGE = 1000


@dataclass
class ExportReport:
    namespace: str
    dest: str
    written: list[str] = field(default_factory=list)  # places, in order
    present: list[str] = field(default_factory=list)  # found whole from an earlier run
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)


def checkpoints_oldest_first(vault: VaultClient, namespace: str) -> list[Checkpoint]:
    pages: list[Checkpoint] = []
    before: str | None = None
    while True:
        page = vault.list(namespace, limit=LIST_PAGE, before=before)
        pages.extend(page)
        if len(page) < LIST_PAGE:
            return pages[::-1]
        before = page[-1].id


def _safe(place: str) -> str:
    parts = PurePosixPath(place).parts
    if place.startswith("/") or ".." in parts or "\\" in place:
        raise ValueError(f"refusing to export to {place!r}: outside the destination")
    return place


def place_of(ckpt: Checkpoint, plain: bool) -> str:
    """Where under the destination a checkpoint's files go ("" for the top)."""
    md = ckpt.metadata
    origin = md.get(IMPORTED_KEY)
    if not plain and isinstance(origin, dict) and isinstance(origin.get("place"), str):
        return _safe(origin["place"])
    if not plain and isinstance(md.get("checkpoint_dir"), str) and md["checkpoint_dir"]:
        return _safe(md["checkpoint_dir"])
    step = md.get("step")
    return f"step-{step}" if isinstance(step, int) else ckpt.id


def _whole(target: Path, ckpt: Checkpoint) -> bool:
    for name, info in ckpt.files.items():
        path = target / name
        if not path.is_file() or path.stat().st_size != info.size:
            return False
    return True


def _set_times(target: Path, ckpt: Checkpoint) -> None:
    origin = ckpt.metadata.get(IMPORTED_KEY)
    mtimes = origin.get("mtimes") if isinstance(origin, dict) else None
    if not isinstance(mtimes, dict):
        return
    for name, ns in mtimes.items():
        if name in ckpt.files and isinstance(ns, int):
            os.utime(target / name, ns=(ns, ns))


def export_series(
    vault: VaultClient,
    namespace: str,
    dest: str | Path,
    *,
    plain: bool = False,
    progress: bool | None = None,
) -> ExportReport:
    """Write every checkpoint of `namespace` under `dest`, oldest first (module docstring)."""
    started = time.monotonic()
    root = Path(dest).expanduser().resolve()
    report = ExportReport(namespace, str(root))
    records = checkpoints_oldest_first(vault, namespace)
    taken: dict[str, str] = {}  # place -> id of the checkpoint written there
    total = sum(c.size for c in records)
    with Progress(progress, total, f"export {namespace}") as bar:
        for ckpt in records:
            place = place_of(ckpt, plain)
            if place in taken and place:  # two checkpoints claim one directory
                place = f"{place}-{ckpt.id}"
            taken[place] = ckpt.id
            target = root / place
            if _whole(target, ckpt):
                report.present.append(place)
            else:
                vault.load(namespace, ckpt.id, target)
                report.written.append(place)
                report.files += len(ckpt.files)
                report.bytes += ckpt.size
            _set_times(target, ckpt)  # also on one found whole: a run may stop before this
            bar.update(ckpt.size)
            bar.note(f"{len(report.written) + len(report.present)}/{len(records)} checkpoints")
    report.seconds = time.monotonic() - started
    return report
