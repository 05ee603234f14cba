"""The distribution's import root: `from checkpoint_vault import VaultClient`.

A training repo's own `client.py` or `api/` shadows a top-level package of ours with that
name; this root does not collide. Today it names the client's public API (`client`'s
names, loaded on first use as there, so importing it stays light); the engine, service and
CLI folders become its subpackages next (issue 42: setuptools' package-dir maps them where
they stand), after which the top-level names go.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from checkpoint_vault import client as _client

if TYPE_CHECKING:
    from checkpoint_vault.client import *  # noqa: F403 - the client's names, for type checkers


def __getattr__(name: str) -> Any:
    if name not in _client.__all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_client, name)
    globals()[name] = value
    return value


__all__ = list(_client.__all__)  # noqa: PLE0605 - the client's, one list
