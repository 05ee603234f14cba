"""LangGraph histories between a SqliteSaver or PostgresSaver database and the vault.

Import: every thread of the database becomes the namespace `VaultSaver` gives it under
`prefix`; its checkpoints are put oldest first, each with its parent's id as the config's
`checkpoint_id` (so the parent link is LangGraph's own), then each task's pending writes
with their task path. Everything goes through `VaultSaver.put` / `put_writes`, so the
records are exactly those a live graph would have made, and `VaultSaver.list` and
`get_tuple` answer what the old saver did.

Resuming: the thread's records in the vault are read first; a checkpoint already there is
not put again, and only the writes of tasks it does not hold yet are (a put or a writes
record is one commit: there whole or not at all). Export runs the same the other way, into
the database's saver, whose puts are upserts.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple

from ..langgraph import VaultSaver
from ..langgraph._codec import decode
from ..langgraph._layout import CHECKPOINT_FILE, KIND_WRITES, WRITES_FILE, Ref, id_tag
from ..progress import Progress
from ..sync import VaultClient
from ._graphdb import GraphDatabase, TaskPaths, open_database

Key = tuple[str, str]  # (checkpoint_ns, checkpoint_id)


@dataclass
class ThreadReport:
    thread_id: str
    namespace: str
    checkpoints: int = 0  # put by this run
    writes: int = 0  # tasks' write batches put by this run
    present: int = 0  # checkpoints found already there


@dataclass
class GraphImportReport:
    source: str
    prefix: str
    dry_run: bool = False
    threads: list[ThreadReport] = field(default_factory=list)
    seconds: float = 0.0

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)


GraphExportReport = GraphImportReport  # the same counts, the other way


def thread_config(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id}}


def oldest_first(saver: BaseCheckpointSaver[Any], thread_id: str) -> list[CheckpointTuple]:
    """Every checkpoint of a thread, every checkpoint_ns, oldest first (LangGraph's ids
    sort by time, and a parent is always older than its child)."""
    found = list(saver.list(thread_config(thread_id)))
    return sorted(found, key=lambda t: t.config["configurable"]["checkpoint_id"])


def _key(t: CheckpointTuple) -> Key:
    conf = t.config["configurable"]
    return str(conf.get("checkpoint_ns", "")), str(conf["checkpoint_id"])


def _tasks(writes: Iterable[tuple[str, str, Any]]) -> dict[str, list[tuple[str, Any]]]:
    """Pending writes by task, each task's in the order the saver gave them."""
    out: dict[str, list[tuple[str, Any]]] = {}
    for task_id, channel, value in writes:
        out.setdefault(task_id, []).append((channel, value))
    return out


def copy_thread(
    source: Sequence[CheckpointTuple],
    target: BaseCheckpointSaver[Any],
    present: dict[Key, set[str]],
    paths: TaskPaths,
    report: ThreadReport,
) -> None:
    """Put into `target` what of `source` it lacks: checkpoints not in `present`, and the
    writes of tasks `present` does not list for theirs."""
    for t in source:
        ns, cid = _key(t)
        thread_id = str(t.config["configurable"]["thread_id"])
        held = present.get((ns, cid))
        if held is None:
            parent = (t.parent_config or {}).get("configurable", {}).get("checkpoint_id")
            conf: RunnableConfig = {
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": parent,
                }
            }
            versions = dict(t.checkpoint.get("channel_versions") or {})
            target.put(conf, t.checkpoint, t.metadata, versions)
            report.checkpoints += 1
            held = set()
        else:
            report.present += 1
        tasks = {k: v for k, v in _tasks(t.pending_writes or []).items() if k not in held}
        task_path = paths(thread_id, ns, cid) if tasks else {}
        for task_id, writes in tasks.items():
            target.put_writes(t.config, writes, task_id, task_path.get(task_id, ""))
            report.writes += 1


def _held(saver: BaseCheckpointSaver[Any], thread_id: str) -> dict[Key, set[str]]:
    """The thread's checkpoints in `saver` with the tasks whose writes each holds."""
    return {
        _key(t): {w[0] for w in t.pending_writes or []}
        for t in saver.list(thread_config(thread_id))
    }


def import_langgraph(
    vault: VaultClient,
    source: str,
    prefix: str = "langgraph",
    *,
    dry_run: bool = False,
    progress: bool | None = None,
) -> GraphImportReport:
    """Every thread of the SqliteSaver file or PostgresSaver URL `source` into namespaces
    under `prefix` (module docstring); run it again after an interruption to finish it."""
    started = time.monotonic()
    report = GraphImportReport(source if "://" not in source else _redacted(source), prefix)
    report.dry_run = dry_run
    with (
        VaultSaver.sharing(vault, prefix=prefix) as saver,
        open_database(source, create=False) as db,
    ):
        threads = db.threads()
        with Progress(progress, len(threads), f"import {prefix}") as bar:
            for thread_id in threads:
                report.threads.append(_import_thread(db, saver, thread_id, dry_run))
                bar.update(1)
                bar.note(f"{sum(t.checkpoints for t in report.threads)} checkpoints")
    report.seconds = time.monotonic() - started
    return report


def _import_thread(
    db: GraphDatabase, saver: VaultSaver, thread_id: str, dry_run: bool
) -> ThreadReport:
    report = ThreadReport(thread_id, saver.layout.namespace(thread_id))
    history = oldest_first(db.saver, thread_id)
    present = _held(saver, thread_id)
    if dry_run:
        report.present = sum(1 for t in history if _key(t) in present)
        report.checkpoints = len(history) - report.present
        return report
    copy_thread(history, saver, present, db.task_paths, report)
    return report


def export_langgraph(
    vault: VaultClient, prefix: str, dest: str, *, progress: bool | None = None
) -> GraphExportReport:
    """Every thread under `prefix` into the SqliteSaver file or PostgresSaver URL `dest`
    (its tables made if missing), as the old saver held them."""
    started = time.monotonic()
    report = GraphImportReport(dest if "://" not in dest else _redacted(dest), prefix)
    with VaultSaver.sharing(vault, prefix=prefix) as saver:
        threads = sorted({str(t.config["configurable"]["thread_id"]) for t in saver.list(None)})
        _export_threads(vault, saver, threads, dest, report, progress)
    report.seconds = time.monotonic() - started
    return report


def _export_threads(
    vault: VaultClient,
    saver: VaultSaver,
    threads: list[str],
    dest: str,
    report: GraphExportReport,
    progress: bool | None,
) -> None:
    with open_database(dest, create=True) as db, Progress(progress, len(threads), "export") as bar:
        for thread_id in threads:
            thread = ThreadReport(thread_id, saver.layout.namespace(thread_id))
            history = oldest_first(saver, thread_id)
            present = _held(db.saver, thread_id)
            copy_thread(history, db.saver, present, _vault_task_paths(vault, saver), thread)
            report.threads.append(thread)
            bar.update(1)


def _vault_task_paths(vault: VaultClient, saver: VaultSaver) -> TaskPaths:
    """Task paths of the writes the vault holds for a checkpoint. `VaultSaver` keeps them
    in its records (`_codec.StoredWrite`) but hands writes back as LangGraph does, without
    them; they are read from the checkpoint's records (found by its id tag)."""

    def paths(thread_id: str, ns: str, cid: str) -> dict[str, str]:
        namespace = saver.layout.namespace(thread_id)
        out: dict[str, str] = {}
        for rec in vault.list(namespace, tag=id_tag(cid), limit=1000):
            ref = Ref.of(rec)
            if ref is None or ref.checkpoint_ns != ns or ref.checkpoint_id != cid:
                continue
            name = WRITES_FILE if ref.kind == KIND_WRITES else CHECKPOINT_FILE
            size = rec.files[name].size
            for w in decode(vault.read_range(namespace, rec.id, name, 0, size)).writes:
                out.setdefault(w.task_id, w.task_path)
        return out

    return paths


def _redacted(url: str) -> str:
    """A database URL without its password, for reports."""
    head, sep, tail = url.partition("://")
    if "@" not in tail:
        return url
    creds, _, host = tail.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{head}{sep}{user}@{host}"
