"""Producer commands: push, pull, ls, show, lineage, mark, pin, unpin, rm."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from checkpoint_vault.client.models import Checkpoint

from .connect import connect
from .output import emit_json, human_bytes, printable, table


def _common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _durable(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--durable",
        action="store_true",
        help=f"{what} only checkpoints durable already (not a commit of parts whose "
        "files are still on their hosts' nodes)",
    )


def register(sub: Any) -> None:
    p = _common(sub.add_parser("push", help="save files or directories as a checkpoint"))
    p.add_argument("namespace")
    p.add_argument("paths", nargs="+", type=Path)
    p.add_argument("--parent", default=None, help="parent checkpoint: an id or 'latest'")
    p.add_argument("--inherit", action="store_true", help="keep the parent's other files")
    p.add_argument(
        "--meta",
        action="append",
        default=[],
        metavar="K=V",
        help="metadata (value parsed as JSON when it is JSON)",
    )
    p.add_argument("--tag", action="append", default=[])
    p.add_argument("--chunking", default=None, help="profile of a new namespace: small|large")
    p.set_defaults(func=push)

    p = _common(sub.add_parser("pull", help="restore a checkpoint into a directory"))
    p.add_argument("namespace")
    p.add_argument("ref", help="checkpoint id, latest or latest-valid")
    p.add_argument("dest", type=Path)
    _durable(p, "latest and latest-valid resolve to")
    p.set_defaults(func=pull)

    p = _common(sub.add_parser("ls", help="list namespaces, or a namespace's checkpoints"))
    p.add_argument("namespace", nargs="?")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--tag", default=None)
    p.add_argument("--validity", default=None, choices=["unverified", "valid", "invalid"])
    _durable(p, "list")
    p.set_defaults(func=ls)

    for name, func, helptext in (
        ("show", show, "one checkpoint's record"),
        ("lineage", lineage, "a checkpoint's chain to its root"),
    ):
        p = _common(sub.add_parser(name, help=helptext))
        p.add_argument("namespace")
        p.add_argument("ref")
        if name == "show":
            p.add_argument(
                "--storage", action="store_true", help="with --json: add how it is stored"
            )
            _durable(p, "latest and latest-valid resolve to")
        p.set_defaults(func=func)

    p = _common(sub.add_parser("mark", help="mark a checkpoint valid or invalid"))
    p.add_argument("namespace")
    p.add_argument("id")
    p.add_argument("state", choices=["valid", "invalid"])
    p.add_argument("--reason", default=None)
    p.set_defaults(func=mark)

    for name, helptext in (
        ("pin", "protect a checkpoint from deletion"),
        ("unpin", "allow deleting a checkpoint again"),
        ("rm", "delete a checkpoint (leaves a tombstone)"),
    ):
        p = _common(sub.add_parser(name, help=helptext))
        p.add_argument("namespace")
        p.add_argument("id")
        p.set_defaults(func=pin_unpin_rm)


def key_values(items: list[str], flag: str = "--meta") -> dict[str, Any]:
    """`FLAG KEY=VALUE`s as a dict, each value read as JSON when it parses (`step=100` is a
    number), else kept as the text."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} {item!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def _files(paths: list[Path]) -> dict[str, Path]:
    """Files by name: a directory's files keep their path under it, a file its own name."""
    files: dict[str, Path] = {}
    for path in paths:
        if path.is_dir():
            for f in sorted(path.rglob("*")):
                if f.is_file():
                    files[f.relative_to(path).as_posix()] = f
        elif path.is_file():
            files[path.name] = path
        else:
            raise ValueError(f"{path}: no such file or directory")
    return files


def _print_records(records: list[Checkpoint]) -> None:
    table(
        ["id", "created", "validity", "size", "files", "pin", "durable", "tags", "parent"],
        [
            [
                r.id,
                r.created_at,
                "deleted" if r.deleted else r.validity.state,
                human_bytes(r.size) if not r.deleted else "-",
                len(r.files),
                "yes" if r.pinned else "",
                "-" if r.deleted else "yes" if r.durable else "no",
                r.tags,
                r.parent,
            ]
            for r in records
        ],
    )


def push(args: argparse.Namespace) -> int:
    with connect(args, progress=None if not args.json else False) as vault:
        ckpt = vault.save(
            args.namespace,
            _files(args.paths),
            parent=args.parent,
            inherit=args.inherit,
            metadata=key_values(args.meta),
            tags=args.tag,
            chunking=args.chunking,
        )
    if args.json:
        emit_json(ckpt.to_wire())
    else:
        print(ckpt.id)
    return 0


def pull(args: argparse.Namespace) -> int:
    ckpt = None
    if args.json or not sys.stderr.isatty():  # no progress bar to show
        from checkpoint_vault.client.restore import (
            load_here,  # a server here writes the files: no client needed
        )

        ckpt = load_here(
            args.url, args.token, args.namespace, args.ref, args.dest, durable=args.durable
        )
    if ckpt is None:
        with connect(args, progress=None if not args.json else False) as vault:
            ckpt = vault.load(args.namespace, args.ref, args.dest, durable=args.durable)
    if args.json:
        emit_json(ckpt.to_wire())
    else:
        print(f"{ckpt.id}: {len(ckpt.files)} file(s), {human_bytes(ckpt.size)} -> {args.dest}")
    return 0


def ls(args: argparse.Namespace) -> int:
    with connect(args, progress=None if not args.json else False) as vault:
        if args.namespace is None:
            spaces = vault.namespaces()
            if args.json:
                emit_json([n.to_wire() for n in spaces])
            else:
                table(
                    ["namespace", "checkpoints", "latest", "logical"],
                    [
                        [n.name, n.checkpoints, n.latest, human_bytes(n.logical_bytes)]
                        for n in spaces
                    ],
                )
            return 0
        records = vault.list(
            args.namespace,
            limit=args.limit,
            tag=args.tag,
            validity=args.validity,
            durable=args.durable,
        )
    if args.json:
        emit_json([r.to_wire() for r in records])
    else:
        _print_records(records)
    return 0


def show(args: argparse.Namespace) -> int:
    with connect(args, progress=None if not args.json else False) as vault:
        ckpt = vault.get(args.namespace, args.ref, durable=args.durable)
        storage = vault.storage(args.namespace, ckpt.id) if args.storage or not args.json else None
    if args.json:
        if storage is not None:
            emit_json({**ckpt.to_wire(), "storage": storage.to_wire()})
        else:
            emit_json(ckpt.to_wire())
        return 0
    assert storage is not None  # fetched whenever the output is not JSON
    _print_records([ckpt])
    print()
    table(
        ["file", "size", "hash"],
        [[n, human_bytes(f.size), f.hash] for n, f in sorted(ckpt.files.items())],
    )
    codecs = ", ".join(
        f"{codec} {human_bytes(c.bytes)} ({c.chunks} chunks)"
        for codec, c in sorted(storage.codecs.items())
    )
    print(
        f"\nstored: {human_bytes(storage.stored_bytes)} for "
        f"{human_bytes(storage.logical_bytes)} ({storage.ratio}x): {codecs or 'nothing'}; "
        f"longest delta chain {storage.max_chain}"
    )
    if ckpt.metadata:
        print("\nmetadata: " + json.dumps(ckpt.metadata, sort_keys=True))
    return 0


def lineage(args: argparse.Namespace) -> int:
    with connect(args, progress=None if not args.json else False) as vault:
        chain = vault.lineage(args.namespace, args.ref)
    if args.json:
        emit_json([r.to_wire() for r in chain])
    else:
        _print_records(chain)
    return 0


def mark(args: argparse.Namespace) -> int:
    with connect(args, progress=None if not args.json else False) as vault:
        if args.state == "valid":
            ckpt = vault.mark_valid(args.namespace, args.id, args.reason)
        else:
            ckpt = vault.mark_invalid(args.namespace, args.id, args.reason)
    if args.json:
        emit_json(ckpt.to_wire())
    else:
        print(printable(f"{ckpt.id}: {ckpt.validity.state}"))
    return 0


def pin_unpin_rm(args: argparse.Namespace) -> int:
    with connect(args, progress=None if not args.json else False) as vault:
        if args.command == "rm":
            vault.delete(args.namespace, args.id)
            result: dict[str, Any] = {"id": args.id, "deleted": True}
        else:
            result = vault.pin(args.namespace, args.id, args.command == "pin").to_wire()
    if args.json:
        emit_json(result)
    else:
        print(f"{args.id}: {'deleted' if args.command == 'rm' else args.command + 'ned'}")
    return 0
