"""Lifecycle commands: retention get|set|plan|apply, verify, and check (online or offline)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from checkpoint_vault.protocol import PolicyRecord, RetentionReport, TieringReport

from .connect import connect
from .offline import check_offline
from .output import emit_json, human_bytes, table

_COUNTS = (
    "keep_last",
    "keep_hourly",
    "keep_daily",
    "keep_weekly",
    "keep_monthly",
    "keep_valid_min",
)


def register(sub: Any) -> None:
    ret = sub.add_parser("retention", help="show, set, plan or apply retention policies")
    rsub = ret.add_subparsers(dest="action", required=True)
    p = rsub.add_parser("get", help="a namespace's policy, or the default")
    p.add_argument("namespace", nargs="?")
    p.add_argument("--json", action="store_true")
    p = rsub.add_parser("set", help="change rules of a namespace's policy, or the default")
    p.add_argument("namespace", nargs="?")
    for rule in _COUNTS:
        p.add_argument("--" + rule.replace("_", "-"), type=int, dest=rule)
    p.add_argument("--keep-within", help="duration, e.g. 7d or 36h")
    p.add_argument("--keep-tag", action="append", dest="keep_tags", help="repeatable")
    p.add_argument(
        "--keep-best",
        metavar="METRIC:min|max:N",
        help="keep the N best checkpoints by a numeric metadata key",
    )
    p.add_argument(
        "--clear",
        action="append",
        default=[],
        metavar="RULE",
        help="unset a rule, e.g. --clear keep_daily",
    )
    p.add_argument("--json", action="store_true")
    for action, helptext in (
        ("plan", "what retention would delete, and why the rest stays"),
        ("apply", "delete what the plan says"),
    ):
        p = rsub.add_parser(action, help=helptext)
        p.add_argument("--namespace", default=None)
        p.add_argument("--json", action="store_true")
    ret.set_defaults(func=retention)

    tier = sub.add_parser("tier", help="show, set, plan or run tiering")
    tsub = tier.add_subparsers(dest="action", required=True)
    p = tsub.add_parser("get", help="a namespace's tiering settings, or the default")
    p.add_argument("namespace", nargs="?")
    p.add_argument("--json", action="store_true")
    p = tsub.add_parser("set", help="change tiering settings of a namespace, or the default")
    p.add_argument("namespace", nargs="?")
    p.add_argument("--target", help="tier name from [tiers.<name>] in the server config")
    p.add_argument("--demote-after", help="duration, e.g. 7d")
    p.add_argument("--keep-hot-last", type=int)
    p.add_argument("--pinned-stay-hot", choices=["true", "false"])
    p.add_argument("--promote-on-read", choices=["true", "false"])
    p.add_argument("--hot-high-watermark", help="bytes or e.g. 40GiB (default policy: all)")
    p.add_argument("--hot-low-watermark", help="bytes or e.g. 30GiB")
    p.add_argument("--repack-below", type=float, help="live fraction (default policy only)")
    p.add_argument(
        "--stage",
        action="append",
        metavar="TIER:AFTER",
        help="a later, colder demotion, e.g. cold:30d (repeat for more; replaces the list)",
    )
    p.add_argument("--json", action="store_true")
    for action, helptext in (
        ("plan", "what would move where"),
        ("run", "move it now"),
        ("status", "bytes and chunks per tier"),
    ):
        p = tsub.add_parser(action, help=helptext)
        p.add_argument("--json", action="store_true")
    tier.set_defaults(func=tiering)

    p = sub.add_parser("verify", help="re-read chunks; invalidate checkpoints with damage")
    p.add_argument("--namespace", default=None)
    p.add_argument("--sample", type=float, default=1.0, help="fraction of chunks to read")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=verify)

    p = sub.add_parser("check", help="recompute reference counts; report drift")
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="check a data dir offline (the server must be stopped)",
    )
    p.add_argument(
        "--config", type=Path, default=None, help="with --data: the server's config file"
    )
    p.add_argument("--repair", action="store_true", help="fix counts, drop unnamed frames")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=check)


def _changes(args: argparse.Namespace) -> dict[str, Any]:
    rules: dict[str, Any] = {r: getattr(args, r) for r in _COUNTS if getattr(args, r) is not None}
    if args.keep_within:
        rules["keep_within"] = args.keep_within
    if args.keep_tags:
        rules["keep_tags"] = args.keep_tags
    if args.keep_best:
        metric, _, rest = args.keep_best.partition(":")
        mode, _, n = rest.partition(":")
        if not metric or mode not in ("min", "max") or not n.isdigit():
            raise ValueError("--keep-best takes METRIC:min|max:N, e.g. eval_loss:min:3")
        rules["keep_best"] = {"metric": metric, "mode": mode, "n": int(n)}
    for rule in args.clear:
        rules[rule] = None
    return {"retention": rules}


def _print_policy(policy: PolicyRecord) -> None:
    rules = policy.retention.to_wire()
    table(["rule", "value"], [[k, v] for k, v in rules.items() if v not in (None, [])])


def retention(args: argparse.Namespace) -> int:
    with connect(args) as vault:
        if args.action in ("get", "set"):
            policy = (
                vault.policy(args.namespace)
                if args.action == "get"
                else vault.set_policy(args.namespace, _changes(args))
            )
            if args.json:
                emit_json(policy.to_wire())
            else:
                _print_policy(policy)
            return 0
        report = vault.retention(args.action == "plan", args.namespace)
    if args.json:
        emit_json(report.to_wire())
    else:
        _print_plan(report, applied=args.action == "apply")
    return 0


def _print_plan(report: RetentionReport, applied: bool) -> None:
    rows = []
    for ns, plan in sorted(report.namespaces.items()):
        rows += [[ns, cid, "keep", ", ".join(why)] for cid, why in plan.keep.items()]
        rows += [[ns, cid, "deleted" if applied else "delete", ""] for cid in plan.delete]
    table(["namespace", "checkpoint", "action", "kept because"], rows)
    verb = "freed once GC runs" if applied else "would be freed"
    print(
        f"\n{len(report.delete)} to delete, {len(report.keep)} kept; "
        f"{human_bytes(report.reclaimable_bytes)} {verb}"
    )


def _tiering_changes(args: argparse.Namespace) -> dict[str, Any]:
    changes: dict[str, Any] = {
        key: getattr(args, key)
        for key in (
            "target",
            "demote_after",
            "keep_hot_last",
            "hot_high_watermark",
            "hot_low_watermark",
            "repack_below",
        )
        if getattr(args, key) is not None
    }
    if args.stage is not None:
        changes["stages"] = [_stage(s) for s in args.stage]
    for flag in ("pinned_stay_hot", "promote_on_read"):
        if getattr(args, flag) is not None:
            changes[flag] = getattr(args, flag) == "true"
    return changes


def _stage(text: str) -> dict[str, str]:
    tier, sep, after = text.partition(":")
    if not sep or not tier or not after:
        raise ValueError(f"--stage {text!r}: expected TIER:AFTER, e.g. cold:30d")
    return {"tier": tier, "after": after}


def tiering(args: argparse.Namespace) -> int:
    with connect(args) as vault:
        if args.action == "get":
            out: dict[str, Any] = vault.policy(args.namespace).tiering
        elif args.action == "set":
            changes = _tiering_changes(args)
            out = vault.set_policy(args.namespace, {"tiering": changes}).tiering
        elif args.action == "status":
            out = {t: v.to_wire() for t, v in vault.stats().tiers.items()}
        else:
            report = vault.tiering(dry_run=args.action == "plan")
            if args.json:
                emit_json(report.to_wire())
            else:
                _print_tiering(report)
            return 0
    if args.json:
        emit_json(out)
    elif args.action == "status":
        table(
            ["tier", "chunks", "bytes"],
            [[t, v["chunks"], human_bytes(v["bytes"])] for t, v in out.items()],
        )
    else:
        table(["key", "value"], [[k, v] for k, v in out.items()])
    return 0


def _print_tiering(report: TieringReport) -> None:
    table(
        ["tier", "checkpoints", "chunks", "bytes"],
        [[t, len(v.checkpoints), v.chunks, human_bytes(v.bytes)] for t, v in report.tiers.items()],
    )
    for t, m in (report.moved or {}).items():
        print(
            f"moved to {t}: {m.chunks} chunks in {m.packs} packs, "
            f"{human_bytes(m.bytes)} at {m.mb_per_s} MB/s"
        )
    back = report.promoted or report.promote
    print(f"back to hot: {back.chunks} chunks, {human_bytes(back.bytes)}")
    if report.by_watermark:
        print(f"demoted early for hot capacity: {len(report.by_watermark)} checkpoints")
    rp = report.repack
    if rp.rewritten is not None:
        print(
            f"repacked {rp.rewritten} packs, deleted {rp.deleted}, "
            f"freed {human_bytes(rp.dead_bytes_freed)}"
        )
    else:
        print(f"to repack: {rp.packs} packs, {human_bytes(rp.dead_bytes)} dead")


def verify(args: argparse.Namespace) -> int:
    with connect(args) as vault:
        out = vault.verify(args.namespace, args.sample)
    if args.json:
        emit_json(out.to_wire())
    else:
        print(
            f"checked {out.chunks_checked} chunks ({human_bytes(out.bytes_checked)}) "
            f"at {out.mb_per_s:.1f} MB/s; corrupt {len(out.corrupt)}, invalidated "
            f"{len(out.checkpoints_invalidated)}, healed {len(out.checkpoints_healed)}"
        )
    return 1 if out.corrupt else 0


def check(args: argparse.Namespace) -> int:
    if args.data is not None:
        out = check_offline(args.data, args.config, args.repair)
    else:
        with connect(args) as vault:
            out = vault.check(args.repair)
    if args.json:
        emit_json(out.to_wire())
    else:
        print(
            f"{'ok' if out.ok else 'PROBLEMS'}: {out.checkpoints} checkpoints, "
            f"{out.chunks} chunks; drift {len(out.drift)}, missing "
            f"{len(out.missing)}, damaged {len(out.damaged)}, orphans "
            f"{len(out.orphans)}, unnamed frames {out.orphan_frames}"
            + (f"; repaired {out.repaired}" if args.repair else "")
        )
    return 0 if out.ok else 1
