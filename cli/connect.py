"""The CLI's one way to reach a server.

The client machinery is imported only when a command actually connects, so `ckpt --help`,
argument errors and `ckpt serve` never pay for it.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from checkpoint_vault.client.sync import VaultClient


def connect(args: argparse.Namespace, progress: bool | None = False) -> VaultClient:
    """A client for `--url`/`--token`; progress bars only where a command asks for them."""
    from checkpoint_vault.client.sync import VaultClient

    return VaultClient(args.url, args.token, progress=progress)
