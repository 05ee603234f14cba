"""The distribution's import root: `from checkpoint_vault import VaultClient`.

The distribution installs this one package; the repository's folders are its subpackages
(`checkpoint_vault.vault`, `.api`, `.node`, `.client`, `.cli`, ...: links here to where
they stand), so a training repo's own `client.py` or `api/` shadows nothing of ours. It
names the client's public API (loaded on first use, as `client` does, so importing it
stays light).
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
