"""Tiers besides the hot LMDB store: a local filesystem, or an object store (S3-compatible,
GCS, Azure) through obstore. Backends implement `vault.tier.Tier`; `open_tier` builds one
from a URL. Moving chunks between tiers (packs, policies) is not built yet: every chunk
lives in the hot tier and checkpoint records report tier "hot"."""

from .backends.local import LocalTier
from .backends.memory import MemoryTier
from .registry import open_tier

__all__ = ["LocalTier", "MemoryTier", "open_tier"]
