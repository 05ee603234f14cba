"""`ckpt serve`: imports the server only when run, so the client stays light."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from checkpoint_vault.protocol import DEFAULT_DATA_DIR, DEFAULT_PORT


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the service")
    p.add_argument(
        "--data", type=Path, default=None, help=f"data dir (default ./{DEFAULT_DATA_DIR})"
    )
    p.add_argument("--host", default=None, help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help=f"listen port (default {DEFAULT_PORT})")
    p.add_argument("--config", type=Path, default=None, help="TOML config file")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="server processes answering on the port; with 2 or more they read and forward "
        "changes to one more process that writes (default [server] workers, 0: one per CPU, "
        "at most 8)",
    )
    p.add_argument("--tls-cert", type=Path, default=None, help="serve HTTPS: certificate (PEM)")
    p.add_argument("--tls-key", type=Path, default=None, help="serve HTTPS: private key (PEM)")
    p.add_argument(
        "--tls-client-ca", type=Path, default=None, help="require client certificates (mTLS)"
    )
    p.add_argument(
        "--follow",
        default=None,
        metavar="replica:NAME",
        help="serve a read-only standby of the replica in tier NAME (the primary's "
        "[replication] tier; [tiers.NAME] must be configured), until `ckpt promote`",
    )
    p.set_defaults(func=run)

    config = sub.add_parser("config", help="show the effective server configuration")
    csub = config.add_subparsers(dest="action", required=True)
    show = csub.add_parser("show", help="defaults, then --config file, then CKPT_* variables")
    show.add_argument("--config", type=Path, default=None, help="TOML config file")
    show.add_argument("--json", action="store_true")
    config.set_defaults(func=show_config)


def show_config(args: argparse.Namespace) -> int:
    import json

    from checkpoint_vault.api.settings import SettingsError, effective_config, load_settings

    try:
        settings = load_settings(args.config)
    except SettingsError as e:
        print(f"ckpt config: {e}", file=sys.stderr)
        return 2
    config = effective_config(settings)
    if args.json:
        print(json.dumps(config, indent=2, sort_keys=True))
        return 0
    for section, values in config.items():
        print(f"[{section}]")
        for key, value in values.items():
            print(f"{key} = {json.dumps(value)}")
        print()
    return 0


def run(args: argparse.Namespace) -> int:
    from checkpoint_vault.node.serve import serve

    from checkpoint_vault.api.settings import SettingsError, load_settings
    from checkpoint_vault.vault import VaultError

    overrides: dict[tuple[str, str], object] = {}
    if args.data is not None:
        overrides[("server", "data_dir")] = args.data
    if args.host is not None:
        overrides[("server", "host")] = args.host
    if args.port is not None:
        overrides[("server", "port")] = args.port
    if args.workers is not None:
        overrides[("server", "workers")] = args.workers
    for key in ("tls_cert", "tls_key", "tls_client_ca"):
        if getattr(args, key) is not None:
            overrides[("server", key)] = getattr(args, key)
    if args.follow is not None:
        overrides[("standby", "follow")] = args.follow
    try:
        settings = load_settings(args.config, overrides=overrides)
    except SettingsError as e:
        print(f"ckpt serve: {e}", file=sys.stderr)
        return 2
    try:
        serve(settings)
    except SettingsError as e:  # e.g. a TLS key that does not match its certificate
        print(f"ckpt serve: {e}", file=sys.stderr)
        return 2
    except VaultError as e:  # e.g. the data dir is already served by another process
        print(f"ckpt serve: {e}", file=sys.stderr)
        return 1
    return 0
