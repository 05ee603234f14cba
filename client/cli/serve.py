"""`ckpt serve`: imports the server only when run, so the client stays light."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..wire import DEFAULT_DATA_DIR, DEFAULT_PORT


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the service")
    p.add_argument(
        "--data", type=Path, default=None, help=f"data dir (default ./{DEFAULT_DATA_DIR})"
    )
    p.add_argument("--host", default=None, help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help=f"listen port (default {DEFAULT_PORT})")
    p.add_argument("--config", type=Path, default=None, help="TOML config file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from api.serve import serve
    from api.settings import SettingsError, load_settings
    from vault import VaultError

    overrides: dict[tuple[str, str], object] = {}
    if args.data is not None:
        overrides[("server", "data_dir")] = args.data
    if args.host is not None:
        overrides[("server", "host")] = args.host
    if args.port is not None:
        overrides[("server", "port")] = args.port
    try:
        settings = load_settings(args.config, overrides=overrides)
    except SettingsError as e:
        print(f"ckpt serve: {e}", file=sys.stderr)
        return 2
    try:
        serve(settings)
    except VaultError as e:  # e.g. the data dir is already served by another process
        print(f"ckpt serve: {e}", file=sys.stderr)
        return 1
    return 0
