"""Operator commands: stats, token create|ls|revoke, gc (online, or offline with --data),
compact."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from checkpoint_vault.protocol import AuditEntry, StatsReport

from .connect import connect
from .offline import gc_offline
from .output import emit_json, human_bytes, printable, table


def register(sub: Any) -> None:
    p = sub.add_parser("stats", help="storage totals and dedup ratio")
    p.add_argument(
        "--namespaces", action="store_true", help="also stored vs logical bytes per namespace"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=stats)

    token = sub.add_parser("token", help="manage API tokens")
    tsub = token.add_subparsers(dest="action", required=True)
    p = tsub.add_parser("create", help="create a token (its secret is printed once)")
    p.add_argument("name")
    p.add_argument(
        "--scope",
        action="append",
        required=True,
        help="admin, read:<glob>, write:<glob> or delete:<glob>; repeatable",
    )
    p.add_argument("--expires", default=None, help="stop working after this long, e.g. 30d")
    p.add_argument("--json", action="store_true")
    p = tsub.add_parser("rotate", help="a new secret; the old one works for --grace more")
    p.add_argument("name")
    p.add_argument("--grace", default="1h", help="how long the old secret keeps working")
    p.add_argument("--json", action="store_true")
    p = tsub.add_parser("ls", help="list tokens")
    p.add_argument("--json", action="store_true")
    p = tsub.add_parser("revoke", help="revoke a token")
    p.add_argument("name")
    p.add_argument("--json", action="store_true")
    token.set_defaults(func=tokens)

    p = sub.add_parser("audit", help="who deleted, pinned, marked, changed policy (newest first)")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=audit)

    p = sub.add_parser("gc", help="collect unreferenced chunks and expired uploads")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="collect in a data dir offline (the server must be stopped)",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="with --data: the server's config file (GC grace, tiers to repack)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=gc)

    p = sub.add_parser("compact", help="re-encode older checkpoints as deltas (returns when done)")
    p.add_argument("--namespace", default=None, help="only this namespace")
    p.add_argument("--rate", default=None, help="most bytes read per second, e.g. 50MiB")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=compact)


def _when(at: float | None) -> str:
    return "-" if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at))


def audit(args: argparse.Namespace) -> int:
    with connect(args) as vault:
        entries = vault.audit(args.limit)
    if args.json:
        emit_json([e.to_wire() for e in entries])
        return 0
    table(
        ["at", "token", "action", "target", "status", "request id"],
        [[_when(e.at), e.token, e.action, _target(e), e.status, e.request_id] for e in entries],
    )
    return 0


def _target(entry: AuditEntry) -> str:
    """The path with the parameters the entry kept (`dry_run`, `namespace`, ...), as the
    request named them; entries no longer keep the raw query (issue 30)."""
    query = "&".join(f"{k}={v}" for k, v in entry.params.items())
    return f"{entry.target}?{query}" if query else entry.target


def stats(args: argparse.Namespace) -> int:
    with connect(args) as vault:
        s = vault.stats(namespaces=args.namespaces)
    if args.json:
        emit_json(s.to_wire())
        return 0
    table(["figure", "value"], _stats_rows(s))
    if args.namespaces:
        print()
        table(
            ["namespace", "logical", "stored", "ratio", "longest chain"],
            [
                [
                    ns,
                    human_bytes(u.logical_bytes),
                    human_bytes(u.stored_bytes),
                    u.ratio,
                    u.max_chain,
                ]
                for ns, u in sorted((s.by_namespace or {}).items())
            ],
        )
    return 0


def _stats_rows(s: StatsReport) -> list[list[Any]]:
    rows: list[list[Any]] = [
        ["checkpoints", s.checkpoints],
        ["namespaces", s.namespaces],
        ["chunks", s.chunks],
        ["logical", human_bytes(s.logical_bytes)],
        ["stored", human_bytes(s.stored_bytes)],
    ]
    if s.disk_bytes is not None:  # servers from before issue 32 leave them out
        rows.append(["on disk", human_bytes(s.disk_bytes)])
    if s.reclaimable_bytes is not None:
        rows.append(["reclaimable", human_bytes(s.reclaimable_bytes)])
    rows.append(["dedup ratio", s.dedup_ratio])
    for codec, c in s.codecs.items():
        rows.append([f"{codec} (recoded)", f"{c.chunks} chunks, {human_bytes(c.bytes)}"])
    for q in s.quotas:
        rows.append([f"quota {q.glob}", f"{human_bytes(q.used)} of {human_bytes(q.limit)}"])
    r = s.replication
    if r:
        rows.append(
            [
                f"replica ({r.mode} to {r.tier})",
                f"lag {r.lag_seconds} s, {human_bytes(r.lag_bytes)} queued "
                f"(budget {r.lag_budget} s)" + (", base pending" if r.base_pending else ""),
            ]
        )
        if r.last_error and r.lag_seconds > r.lag_budget:
            rows.append(["replica error", r.last_error])
        if r.fenced_by is not None:
            rows.append(["fenced", f"epoch {r.fenced_by} was promoted: writes refused"])
    sb = s.standby
    if sb:
        lag = "unknown" if sb.lag_seconds is None else f"{sb.lag_seconds} s"
        rows.append([f"standby of {sb.tier}", f"{sb.state}, epoch {sb.epoch}, lag {lag}"])
        if sb.last_error:
            rows.append(["standby error", sb.last_error])
    return rows


def tokens(args: argparse.Namespace) -> int:
    with connect(args) as vault:
        out: Any
        if args.action in ("create", "rotate"):
            issued = (
                vault.create_token(args.name, args.scope, args.expires)
                if args.action == "create"
                else vault.rotate_token(args.name, args.grace)
            )
            for warning in issued.warnings or []:
                print(f"warning: {printable(warning)}", file=sys.stderr)
            if not args.json:
                print(issued.token)
            out = issued.to_wire()
        elif args.action == "ls":
            listed = vault.tokens()
            if not args.json:
                table(
                    ["name", "scopes", "expires", "last used"],
                    [[t.name, t.scopes, _when(t.expires_at), _when(t.last_used)] for t in listed],
                )
            out = [t.to_wire() for t in listed]
        else:
            vault.revoke_token(args.name)
            out = {"name": args.name, "revoked": True}
            if not args.json:
                print(f"{args.name}: revoked")
    if args.json:
        emit_json(out)
    return 0


def gc(args: argparse.Namespace) -> int:
    if args.data is not None:
        report = gc_offline(args.data, args.config, args.dry_run)
    else:
        with connect(args) as vault:
            report = vault.gc(args.dry_run)
    if args.json:
        emit_json(report.to_wire())
    else:
        verb = "would free" if args.dry_run else "freed"
        print(
            f"{verb} {report.chunks_deleted} chunks, {human_bytes(report.bytes_freed)}; "
            f"{report.uploads_expired} expired uploads removed"
        )
    return 0


def compact(args: argparse.Namespace) -> int:
    with connect(args) as vault:
        report = vault.compact(args.namespace, args.rate)
    if args.json:
        emit_json(report.to_wire())
    else:
        print(
            f"compacted {report.checkpoints} checkpoints: {report.chunks_recoded} chunks "
            f"re-encoded ({report.deltas} deltas, {report.grouped} grouped), "
            f"{human_bytes(report.saved_bytes)} saved in {report.seconds:.1f} s "
            f"({report.cpu_seconds:.1f} CPU s)"
        )
    return 0
