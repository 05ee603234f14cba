"""`ckpt status` (role and standby lag, no token needed) and `ckpt promote` (admin)."""

from __future__ import annotations

import argparse
from typing import Any

from .connect import connect
from .output import emit_json, table


def register(sub: Any) -> None:
    p = sub.add_parser("status", help="the server's role (primary, standby, fenced) and lag")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=status)
    p = sub.add_parser(
        "promote",
        help="make this standby the primary: apply all the replica has, fence the old "
        "primary, replicate to the same tier and take writes",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=promote)


def status(args: argparse.Namespace) -> int:
    with connect(args) as vault:
        out = vault.health()
    if args.json:
        emit_json(out.to_wire())
        return 0
    rows = [["role", out.role], ["version", out.version]]
    if out.role == "standby":
        lag = out.lag_seconds
        rows.append(["behind the replica", "unknown" if lag is None else f"{lag} s"])
    table(["figure", "value"], rows)
    return 0


def promote(args: argparse.Namespace) -> int:
    with connect(args) as vault:
        out = vault.promote()
    if args.json:
        emit_json(out.to_wire())
    else:
        print(
            f"promoted: epoch {out.epoch}, {out.role}; the old primary is fenced "
            f"(caught up through segment {out.fence} of {out.generation}, "
            f"{out.seconds} s)"
        )
    return 0
