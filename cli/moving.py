"""Moving in and out: `import` and `export` (client/importers).

`ckpt import SOURCE NAMESPACE`: a directory series (HF, Lightning, DCP, plain files), local or
at an fsspec URL (`s3://bucket/prefix`, with `--storage-option KEY=VALUE` for its filesystem),
or a LangGraph database (`postgresql://...`, or a SQLite file) whose threads become namespaces
under NAMESPACE. `ckpt export NAMESPACE DEST`: back to a directory, or, for a LangGraph
prefix, into a database (`postgresql://...`, `sqlite:PATH` or a path ending .sqlite/.db).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .checkpoints import key_values
from .connect import connect
from .output import emit_json, human_bytes, printable, table

SQLITE_MAGIC = b"SQLite format 3\x00"
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")


def register(sub: Any) -> None:
    p = sub.add_parser("import", help="import a checkpoint series or a LangGraph database")
    p.add_argument("source", help="directory, fsspec URL (s3://...), SQLite file or postgresql://")
    p.add_argument("namespace", help="the namespace (a LangGraph source: the threads' prefix)")
    p.add_argument("--layout", default=None, choices=["hf", "lightning", "dcp", "plain"])
    p.add_argument("--strict", action="store_true", help="stop at a bad entry, import nothing")
    p.add_argument("--dry-run", action="store_true", help="print what would be created")
    p.add_argument("--chunking", default=None, help="profile of a new namespace: small|large")
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="for a URL source's fsspec filesystem (s3: endpoint_url=http://...); "
        "VALUE is read as JSON when it parses (true, 3, {...}), else as a string",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=import_)

    p = sub.add_parser("export", help="write a namespace back out as it came in")
    p.add_argument("namespace", help="the namespace (a LangGraph destination: the prefix)")
    p.add_argument("dest", help="directory, sqlite:PATH (or *.sqlite/*.db) or postgresql:// URL")
    p.add_argument("--plain", action="store_true", help="step-N/ directories, not the source's")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=export)


def _is_sqlite_file(source: str) -> bool:
    path = Path(source)
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC


def _database(target: str, *, reading: bool) -> str | None:
    """The LangGraph database `target` names (a postgresql:// URL or a SQLite path), or
    None for a directory series."""
    if target.startswith(POSTGRES_SCHEMES):
        return target
    if target.startswith("sqlite:"):
        return target.removeprefix("sqlite:").removeprefix("//")
    if reading:
        return target if _is_sqlite_file(target) else None
    return target if target.endswith(SQLITE_SUFFIXES) else None


def import_(args: argparse.Namespace) -> int:
    from checkpoint_vault.client import importers

    options = key_values(args.storage_option, "--storage-option")
    database = _database(args.source, reading=True)
    with connect(args) as vault:
        if database is not None:
            graph = importers.import_langgraph(
                vault, database, args.namespace, dry_run=args.dry_run, progress=_bar(args)
            )
            verb = "to import (dry run)" if args.dry_run else "imported"
            return _print_graph(args, graph.to_wire(), verb)
        report = importers.import_series(
            vault,
            args.source,
            args.namespace,
            layout=args.layout,
            strict=args.strict,
            dry_run=args.dry_run,
            chunking=args.chunking,
            progress=_bar(args),
            storage_options=options,
        )
    if args.json:
        emit_json(report.to_wire())
        return 0
    verb = "would create" if args.dry_run else "created"
    table(
        ["step", "entry", "action", "files", "size", "checkpoint / reason"],
        [
            [
                e.step if e.step >= 0 else "-",
                e.key,
                verb if e.action == "create" else e.action,
                e.files,
                human_bytes(e.bytes),
                e.reason or e.id or "",
            ]
            for e in report.entries
        ],
    )
    print()
    if args.dry_run:
        planned = sum(e.bytes for e in report.entries if e.action == "create")
        done = f"{human_bytes(planned)} to send at most"
    else:
        rate = report.bytes / report.seconds / 2**20 if report.seconds else 0.0
        done = (
            f"{human_bytes(report.bytes)} in {report.seconds:.1f} s ({rate:.1f} MiB/s), "
            f"{human_bytes(report.unique_bytes)} in new chunks"
        )
    print(
        printable(
            f"{report.layout} series {report.source} -> {report.namespace}: "
            f"{report.count('create')} {verb}, {report.count('present')} present, "
            f"{report.count('skip')} skipped; {done}"
        )
    )
    return 0


def export(args: argparse.Namespace) -> int:
    from checkpoint_vault.client import importers

    database = _database(args.dest, reading=False)
    with connect(args) as vault:
        if database is not None:
            graph = importers.export_langgraph(vault, args.namespace, database)
            return _print_graph(args, graph.to_wire(), "exported")
        report = importers.export_series(
            vault, args.namespace, args.dest, plain=args.plain, progress=_bar(args)
        )
    if args.json:
        emit_json(report.to_wire())
        return 0
    print(
        printable(
            f"{args.namespace} -> {report.dest}: {len(report.written)} written, "
            f"{len(report.present)} present; {report.files} files, "
            f"{human_bytes(report.bytes)} in {report.seconds:.1f} s"
        )
    )
    return 0


def _bar(args: argparse.Namespace) -> bool | None:
    """A progress bar on a terminal, never under --json."""
    return False if args.json else None


def _print_graph(args: argparse.Namespace, report: dict[str, Any], verb: str) -> int:
    if args.json:
        emit_json(report)
        return 0
    table(
        ["thread", "namespace", "checkpoints", "writes", "present"],
        [
            [t["thread_id"], t["namespace"], t["checkpoints"], t["writes"], t["present"]]
            for t in report["threads"]
        ],
    )
    print()
    print(f"{len(report['threads'])} thread(s) {verb} in {report['seconds']:.1f} s")
    return 0
