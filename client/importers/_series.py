"""Importing a directory series: scan it whole, then save each entry, in step order, as
the child of the one before.

Resuming rests on one invariant: a checkpoint committed by an import carries, in its
metadata under `imported`, the source directory and the entry's key. Before sending
anything the importer lists the namespace and skips every entry already there, taking it
as the parent of the next, so an import killed at any moment and run again adds exactly
the entries missing (a commit is atomic: an entry is there whole or not at all). The one
window it cannot see is a commit still in flight on the server when the new run lists;
runs of one import must not overlap.

A source is a local directory (a path or `file://`) or any fsspec URL (`s3://bucket/prefix`,
`gs://`, `memory://`; see _remote.py). A remote entry's files are streamed into the save,
never staged on disk: the client reads a file object as it reads a local file, in pieces,
so memory stays at the client's buffers whatever the entry's size, and nothing is left
behind by a kill. An entry of at most `SMALL_SAVE_LIMIT` bytes is read whole first, so
that it goes in the client's one-request save, as a small local entry does.

Bad entries (`Entry.problem`) are known from the scan: they are skipped and reported, or,
with `strict`, the import stops before its first save.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from ..aio import SMALL_SAVE_LIMIT
from ..chunking import FileSpec
from ..errors import NotFound
from ..manager import finite_metrics
from ..models import Checkpoint
from ..progress import Progress
from ..sync import VaultClient
from . import _dcp, _hf, _lightning, _plain
from ._entries import IMPORTED_KEY, Entry, Scanner, SourcePath, provenance
from ._remote import RemotePath, RemoteSourceError, is_remote, open_remote

LAYOUTS: dict[str, Scanner] = {"hf": _hf, "dcp": _dcp, "lightning": _lightning, "plain": _plain}
DIR_LAYOUTS = ("hf", "dcp")  # a directory per checkpoint
FILE_LAYOUTS = ("lightning", "plain")  # files at the top; tried after the directory ones
MANAGED_TAGS = frozenset({"best"})  # tags an import moves as the source's best moves
LIST_PAGE = 1000
CHECKED = finite_metrics("loss", "eval_loss", "train_loss", "val_loss")  # absent ones pass


class BadSource(ValueError):
    """The source cannot be imported as asked: not a directory, no layout recognised, an
    ambiguous one, or (with `strict`) a bad entry."""


@dataclass
class Planned:
    """What the import does with one entry: `create` (done, or would be in a dry run),
    `present` (imported before), `skip` (its problem in `reason`)."""

    key: str
    step: int
    action: str
    files: int
    bytes: int
    id: str | None = None
    reason: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class ImportReport:
    namespace: str
    source: str
    layout: str
    dry_run: bool
    entries: list[Planned] = field(default_factory=list)
    bytes: int = 0  # bytes of the checkpoints created by this run
    files: int = 0
    unique_bytes: int = 0  # of those, in chunks not already met in this run (before compression)
    seconds: float = 0.0

    def count(self, action: str) -> int:
        return sum(1 for e in self.entries if e.action == action)

    def to_wire(self) -> dict[str, Any]:
        return {**asdict(self), "created": self.count("create"), "present": self.count("present")}


def detect_layout(root: SourcePath) -> str:
    """The layout of a series directory; BadSource when none, or two directory layouts,
    match (then `layout=` says which)."""
    dirs = [name for name in DIR_LAYOUTS if LAYOUTS[name].matches(root)]
    if len(dirs) > 1:
        raise BadSource(f"{root}: both {' and '.join(dirs)} checkpoints; choose with --layout")
    if dirs:
        return dirs[0]
    for name in FILE_LAYOUTS:
        if LAYOUTS[name].matches(root):
            return name
    raise BadSource(f"{root}: no checkpoint series recognised (layouts: {', '.join(LAYOUTS)})")


def imported(vault: VaultClient, namespace: str, source: str) -> dict[str, Checkpoint]:
    """The namespace's checkpoints imported from `source`, by entry key."""
    out: dict[str, Checkpoint] = {}
    before: str | None = None
    while True:
        try:
            page = vault.list(namespace, limit=LIST_PAGE, before=before)
        except NotFound:
            return out
        for ckpt in page:
            origin = ckpt.metadata.get(IMPORTED_KEY)
            if isinstance(origin, dict) and origin.get("from") == source:
                out.setdefault(str(origin.get("key")), ckpt)
        if len(page) < LIST_PAGE:
            return out
        before = page[-1].id


def source_root(source: str | Path, storage_options: Mapping[str, Any] | None = None) -> SourcePath:
    """The directory `source` names: a path or a `file://` URL (a local `Path`), or another
    fsspec URL, listed through fsspec with `storage_options` (s3fs: `endpoint_url`, `key`,
    `secret`..., else its own environment variables)."""
    text = str(source)
    if is_remote(text):
        try:
            return open_remote(text, storage_options)
        except RemoteSourceError as e:
            raise BadSource(str(e)) from None
    if text.startswith("file://"):
        return Path(unquote(urlparse(text).path)).resolve()
    return Path(text).expanduser().resolve()


def scan_source(
    source: str | Path, layout: str | None, storage_options: Mapping[str, Any] | None = None
) -> tuple[SourcePath, str, list[Entry]]:
    root = source_root(source, storage_options)
    if not root.is_dir():
        raise BadSource(f"{source}: not a directory")
    if layout is not None and layout not in LAYOUTS:
        raise BadSource(f"unknown layout {layout!r}: one of {', '.join(LAYOUTS)}")
    layout = layout or detect_layout(root)
    entries = sorted(LAYOUTS[layout].scan(root), key=lambda e: (e.step, e.key))
    return root, layout, entries


def import_series(
    vault: VaultClient,
    source: str | Path,
    namespace: str,
    *,
    layout: str | None = None,
    strict: bool = False,
    dry_run: bool = False,
    chunking: str | None = None,
    progress: bool | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> ImportReport:
    """Import the checkpoint series in directory `source` (a path or an fsspec URL) into
    `namespace` (see the module docstring); run it again after an interruption to finish
    it. `layout`: one of `LAYOUTS` (None: detected). `chunking`: the namespace's profile
    if this import creates it. `progress`: a bar with files and unique bytes so far (None:
    on a terminal). `storage_options`: for fsspec's filesystem of a URL source."""
    started = time.monotonic()
    root, layout, entries = scan_source(source, layout, storage_options)
    present = imported(vault, namespace, str(root))
    bad = [e for e in entries if e.problem is not None and e.key not in present]
    if strict and bad:
        raise BadSource("; ".join(str(e.problem) for e in bad) + " (nothing imported: --strict)")
    report = ImportReport(namespace, str(root), layout, dry_run)
    for e in entries:
        # Imported before wins over a problem found now (a file since removed): it stays
        # in the chain as the parent of what follows.
        action = "present" if e.key in present else "skip" if e.problem else "create"
        done = present.get(e.key)
        report.entries.append(
            Planned(
                e.key,
                e.step,
                action,
                len(e.files),
                e.size if e.files else 0,
                done.id if done else None,
                None if action == "present" else e.problem,
                list(e.tags),
            )
        )
    if not dry_run:
        _run(vault, root, layout, entries, present, report, chunking, progress)
    report.seconds = time.monotonic() - started
    return report


def _run(
    vault: VaultClient,
    root: SourcePath,
    layout: str,
    entries: list[Entry],
    present: dict[str, Checkpoint],
    report: ImportReport,
    chunking: str | None,
    progress: bool | None,
) -> None:
    todo = sum(p.bytes for p in report.entries if p.action == "create")
    seen: set[str] = set()
    parent: str | None = None
    with Progress(progress, todo, f"import {report.namespace}") as bar:
        for entry, planned in zip(entries, report.entries, strict=True):
            if planned.action == "skip":
                continue
            if planned.action == "present":
                parent = present[entry.key].id
                if entry.problem is None:  # else its tags, as scanned now, say nothing
                    _retag(vault, present[entry.key], entry)
                _judge(vault, present[entry.key])
                continue
            metadata = {**entry.metadata, IMPORTED_KEY: provenance(root, layout, entry)}
            with _opened(entry) as files:
                ckpt = vault.save(
                    report.namespace,
                    files,
                    parent=parent,
                    metadata=metadata,
                    tags=entry.tags,
                    chunking=chunking,
                )
            parent = planned.id = ckpt.id
            _judge(vault, ckpt)
            report.bytes += planned.bytes
            report.files += planned.files
            report.unique_bytes += _new_bytes(vault, ckpt, seen)
            bar.update(planned.bytes)
            bar.note(f"{report.files} files, {_share(report)} unique")


@contextmanager
def _opened(entry: Entry) -> Iterator[Mapping[str, FileSpec]]:
    """The entry's files as the client's save takes them: local paths as they are (the
    server may take them by descriptor), remote ones read whole when the entry is small,
    else open file objects the client streams from, closed after the save."""
    out: dict[str, FileSpec] = {}
    small = entry.size <= SMALL_SAVE_LIMIT
    with ExitStack() as stack:
        for name, path in entry.files.items():
            if not isinstance(path, RemotePath):
                out[name] = path
            elif small:
                out[name] = path.read_bytes()
            else:
                out[name] = stack.enter_context(path.open("rb"))
        yield out


def _judge(vault: VaultClient, ckpt: Checkpoint) -> None:
    """Mark invalid a checkpoint whose loss was NaN or infinite, as `VaultCallback` does,
    so `resume_from_vault` ("latest-valid") never resumes from it. Others stay
    unverified: nothing here checked them."""
    verdict = CHECKED(ckpt)
    if verdict is not True and ckpt.validity.state != "invalid":
        vault.mark_invalid(ckpt.namespace, ckpt.id, str(verdict))


def _retag(vault: VaultClient, ckpt: Checkpoint, entry: Entry) -> None:
    """Move the tags an import manages (the source's best moves as it trains on)."""
    kept = [t for t in ckpt.tags if t not in MANAGED_TAGS]
    wanted = kept + [t for t in entry.tags if t in MANAGED_TAGS and t not in kept]
    if sorted(wanted) != sorted(ckpt.tags):
        vault.tag(ckpt.namespace, ckpt.id, wanted)


def _new_bytes(vault: VaultClient, ckpt: Checkpoint, seen: set[str]) -> int:
    """Bytes of the checkpoint's chunks not in `seen` (then added to it)."""
    fresh = 0
    for f in vault.manifest(ckpt.namespace, ckpt.id).files.values():
        for chunk in f.chunks:
            if chunk.id not in seen:
                seen.add(chunk.id)
                fresh += chunk.size
    return fresh


def _share(report: ImportReport) -> str:
    if not report.bytes:
        return "-"
    return f"{100 * report.unique_bytes / report.bytes:.0f}%"
