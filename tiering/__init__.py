"""Tiers besides the hot LMDB store (filesystem, object storage). Not built yet: every
chunk lives in the hot tier, and checkpoint records report tier "hot"."""

__all__: list[str] = []
