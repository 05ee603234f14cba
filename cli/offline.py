"""Offline maintenance: open a stopped server's data dir directly and run the maintenance
task on it (maintenance/), as the schedule and the admin routes run it, under the vault's
maintenance lock (docs/DESIGN.md, "Maintenance").

A running server holds its data dir's lock for as long as it runs, so opening fails at once
with "in use": an offline command never waits for a server, nor runs beside one. Imports the
server packages only when called, so the client stays light.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from vault import Vault


def open_offline(command: str, data_dir: Path, config: Path | None) -> Vault:
    """The vault of `data_dir`, configured by `config` (tiers, key file, engine settings;
    defaults without one). Exits 1 with one line on stderr if it cannot be opened."""
    from api.engine import open_vault
    from api.settings import SettingsError, load_settings
    from vault import VaultError, VaultInUse

    if not (data_dir / "vault").is_dir():
        raise ValueError(f"{data_dir} holds no vault (no {data_dir / 'vault'})")
    try:
        settings = load_settings(config, overrides={("server", "data_dir"): data_dir})
    except SettingsError as e:
        _fail(command, str(e))
    try:
        return open_vault(settings)
    except VaultInUse as e:
        _fail(
            command,
            f"{e} (a running server?): stop it first, or run the command without --data "
            "to go through the server",
        )
    except VaultError as e:
        _fail(command, str(e))


def _fail(command: str, message: str) -> NoReturn:
    print(f"ckpt {command}: {message}", file=sys.stderr)
    raise SystemExit(1)
