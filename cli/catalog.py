"""`ckpt catalog backup|restore`: copies of the catalog, and a data dir rebuilt from one."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .connect import connect
from .output import emit_json


def register(sub: Any) -> None:
    cat = sub.add_parser("catalog", help="back up the catalog, or restore a data dir from one")
    csub = cat.add_subparsers(dest="action", required=True)
    p = csub.add_parser("backup", help="copy the catalog while the service runs")
    p.add_argument(
        "dest",
        nargs="?",
        default=None,
        help="a configured tier name, or a file name in the server's [server] backup_dir "
        "(default: the last tier configured, the coldest)",
    )
    p.add_argument("--json", action="store_true")
    p = csub.add_parser("restore", help="rebuild a data dir from a backup (server stopped)")
    p.add_argument(
        "src",
        help="a backup file, tier:NAME for the newest backup in that tier, or replica:NAME "
        "for the continuous replica there ([replication]: base copy plus log, frames too)",
    )
    p.add_argument(
        "--until",
        type=float,
        default=None,
        help="replica:NAME only: stop before the first commit after this Unix time",
    )
    p.add_argument("--data", type=Path, required=True, help="an empty data dir to fill")
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="the server config: tiers (for tier:NAME) and the key file of sealed backups",
    )
    p.add_argument("--json", action="store_true")
    cat.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.action == "backup":
        with connect(args) as vault:
            out = vault.catalog_backup(args.dest).to_wire()
    else:
        from checkpoint_vault.vault import VaultError

        try:
            out = _restore(args.src, args.data, args.config, args.until)
        except VaultError as e:  # offline: engine errors are the message to show
            raise ValueError(str(e)) from None
    if args.json:
        emit_json(out)
    else:
        print(" ".join(f"{k}={v}" for k, v in out.items()))
    return 0


def _restore(
    src: str, data: Path, config: Path | None, until: float | None = None
) -> dict[str, Any]:
    """From a file, a tier's `latest` backup or a tier's replica; sealed objects are opened
    with the config's key file (the same one the service ran with). The engine's `restore`
    (or `restore_replica`) does the work, holding the new data dir's maintenance lock."""
    from checkpoint_vault.api.settings import load_settings
    from checkpoint_vault.tiering import open_tier
    from checkpoint_vault.vault.backup import latest_backup, restore
    from checkpoint_vault.vault.replication import restore_replica
    from checkpoint_vault.vault.seal import Keyring

    settings = load_settings(config)
    keyring = Keyring.load(settings.key_file) if settings.key_file is not None else None
    if src.startswith(("tier:", "replica:")):
        name = src.partition(":")[2]
        spec = settings.tiers.get(name)
        if spec is None:
            print(f"ckpt catalog: no [tiers.{name}] in the config", file=sys.stderr)
            raise SystemExit(1)
        tier = open_tier(name, spec["url"], {k: v for k, v in spec.items() if k != "url"})
        if src.startswith("replica:"):
            restored = restore_replica(tier, data / "vault", keyring, until)
            return {"from": src, **restored.to_wire()}
        key, raw = latest_backup(tier)
        origin = f"{name}:{key}"
    else:
        raw, origin = Path(src).read_bytes(), src
    return {"from": origin, **restore(raw, data / "vault", keyring)}
