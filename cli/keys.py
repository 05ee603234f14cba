"""`ckpt key add FILE`: a new encryption key, appended to a key file (created mode 600).

The new key becomes the one that seals new data; the older ones stay to open what they
sealed. Runs on the server's machine: the key file never travels over HTTP.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .output import emit_json


def register(sub: Any) -> None:
    key = sub.add_parser("key", help="manage the encryption key file (encryption at rest)")
    ksub = key.add_subparsers(dest="action", required=True)
    p = ksub.add_parser("add", help="append a new active key to FILE, creating it if needed")
    p.add_argument("file", type=Path)
    p.add_argument("--json", action="store_true")
    key.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from checkpoint_vault.vault import VaultError
    from checkpoint_vault.vault.seal import add_key

    try:
        key_id = add_key(args.file)
    except VaultError as e:
        raise ValueError(str(e)) from None
    out = {"file": str(args.file), "key_id": key_id}
    if args.json:
        emit_json(out)
    else:
        print(f"key {key_id} added to {args.file}; it seals new data from the next start")
    return 0
