"""`ckpt catalog backup|restore`: copies of the catalog, and a data dir rebuilt from one."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..sync import VaultClient
from .output import emit_json


def register(sub: Any) -> None:
    cat = sub.add_parser("catalog", help="back up the catalog, or restore a data dir from one")
    csub = cat.add_subparsers(dest="action", required=True)
    p = csub.add_parser("backup", help="copy the catalog while the service runs")
    p.add_argument(
        "dest",
        nargs="?",
        default=None,
        help="a configured tier name or an absolute path on the server "
        "(default: the last tier configured, the coldest)",
    )
    p.add_argument("--json", action="store_true")
    p = csub.add_parser("restore", help="rebuild a data dir from a backup (server stopped)")
    p.add_argument("src", help="a backup file, or tier:NAME for the newest in that tier")
    p.add_argument("--data", type=Path, required=True, help="an empty data dir to fill")
    p.add_argument(
        "--config", type=Path, default=None, help="server config declaring the tier (for tier:NAME)"
    )
    p.add_argument("--json", action="store_true")
    cat.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.action == "backup":
        with VaultClient(args.url, args.token, progress=False) as vault:
            out = vault.catalog_backup(args.dest)
    else:
        out = _restore(args.src, args.data, args.config)
    if args.json:
        emit_json(out)
    else:
        print(" ".join(f"{k}={v}" for k, v in out.items()))
    return 0


def _restore(src: str, data: Path, config: Path | None) -> dict[str, Any]:
    from api.catalog_backup import LATEST
    from api.settings import load_settings
    from tiering import open_tier
    from vault.backup import restore_catalog

    if not src.startswith("tier:"):
        return {"from": src, **restore_catalog(Path(src), data / "vault")}
    name = src[len("tier:") :]
    spec = load_settings(config).tiers.get(name)
    if spec is None:
        print(f"ckpt catalog: no [tiers.{name}] in the config", file=sys.stderr)
        raise SystemExit(1)
    tier = open_tier(name, spec["url"], {k: v for k, v in spec.items() if k != "url"})
    key = tier.get(LATEST).decode()
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "catalog.mdb"
        copy.write_bytes(tier.get(key))
        return {"from": f"{name}:{key}", **restore_catalog(copy, data / "vault")}
