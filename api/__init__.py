"""Checkpoint Vault's HTTP service (aiohttp): routing, auth, streaming, error mapping."""

__version__ = "0.1.0"

from .app import create_app  # noqa: E402
from .settings import Settings, load_settings  # noqa: E402

__all__ = ["Settings", "__version__", "create_app", "load_settings"]
