"""The `ckpt` command: producer and operator commands over HTTP, and `serve`.

Every command takes `--json` (machine output on stdout), prints tables for people otherwise,
exits 0 on success and 1 with one line on stderr on failure (2 for usage errors). The
commands that run the engine here (`serve`, the offline ones) import the server only when run:
on a client-only install (`pip install .`) they name the extra to install instead.
"""

from __future__ import annotations

import argparse
import sys

from checkpoint_vault.client.errors import ClientError

from . import admin, catalog, checkpoints, cluster, keys, lifecycle, moving, serve, standby
from .output import printable

# What `pip install '.[server]'` adds: a command that needs one of these runs the engine here.
SERVER_PACKAGES = frozenset(
    {"aiohttp", "cryptography", "lmdb", "numcodecs", "numpy", "obstore", "prometheus_client"}
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ckpt", description="Checkpoint Vault")
    parser.add_argument("--url", default=None, help="server URL (default: $CKPT_URL or local)")
    parser.add_argument("--token", default=None, help="API token (default: $CKPT_TOKEN)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve.register(sub)
    checkpoints.register(sub)
    admin.register(sub)
    lifecycle.register(sub)
    catalog.register(sub)
    keys.register(sub)
    standby.register(sub)
    moving.register(sub)
    cluster.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ClientError as e:
        print(f"ckpt {args.command}: {printable(e.message)}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in SERVER_PACKAGES:
            raise
        print(
            f"ckpt {args.command}: this command runs the server, which is not installed "
            f"(no module {e.name!r}): pip install 'checkpoint-vault[server]'",
            file=sys.stderr,
        )
        return 1
    except (OSError, ValueError) as e:
        print(f"ckpt {args.command}: {printable(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"ckpt {args.command}: interrupted", file=sys.stderr)
        return 130
