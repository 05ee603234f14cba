"""Checkpoint Vault's HTTP service (aiohttp): routing, auth, streaming, error mapping.

`create_app` loads on first use: the settings (`api.settings`) and the offline commands'
`api.engine` import no aiohttp.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .settings import Settings, load_settings

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .app import create_app


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Settings", "__version__", "create_app", "load_settings"]
