"""Offline maintenance: open a stopped server's data dir directly and run the maintenance
task on it (maintenance/), as the schedule and the admin routes run it, under the vault's
maintenance lock (docs/DESIGN.md, "Maintenance").

A running server holds its data dir's lock for as long as it runs, so opening fails at once
with "in use": an offline command never waits for a server, nor runs beside one. Imports the
server packages only when called, so the client stays light.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeVar

if TYPE_CHECKING:
    from checkpoint_vault.maintenance import Report
    from checkpoint_vault.protocol import CheckReport, GcReport
    from checkpoint_vault.vault import Vault

R = TypeVar("R", bound="Report")


def open_offline(command: str, data_dir: Path, config: Path | None) -> Vault:
    """The vault of `data_dir`, configured by `config` (tiers, key file, engine settings;
    defaults without one). Exits 1 with one line on stderr if it cannot be opened."""
    from checkpoint_vault.api.engine import open_vault
    from checkpoint_vault.api.settings import SettingsError, load_settings
    from checkpoint_vault.vault import VaultError, VaultInUse
    from checkpoint_vault.vault.ownership import prepare_data_dir

    if not (data_dir / "vault").is_dir():
        raise ValueError(f"{data_dir} holds no vault (no {data_dir / 'vault'})")
    try:
        settings = load_settings(config, overrides={("server", "data_dir"): data_dir})
    except SettingsError as e:
        _fail(command, str(e))
    try:
        prepare_data_dir(settings.data_dir)  # as `ckpt serve` does: the server's user's alone
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


def gc_offline(data_dir: Path, config: Path | None, dry_run: bool) -> GcReport:
    """GC, then repack when the config has tiers: the task the schedule and the route run."""
    from checkpoint_vault import maintenance

    return _run("gc", data_dir, config, lambda vault: maintenance.gc(vault, dry_run))


def check_offline(data_dir: Path, config: Path | None, repair: bool) -> CheckReport:
    """The check the route runs."""
    from checkpoint_vault import maintenance

    return _run("check", data_dir, config, lambda vault: maintenance.check(vault, repair))


def _run(command: str, data_dir: Path, config: Path | None, task: Callable[[Vault], R]) -> R:
    """`task` run as `maintenance.run` runs every task (under the maintenance lock), on the
    stopped server's vault, closed after."""
    from checkpoint_vault import maintenance

    vault = open_offline(command, data_dir, config)
    try:
        return maintenance.run(vault, command, lambda: task(vault))
    finally:
        vault.close()
