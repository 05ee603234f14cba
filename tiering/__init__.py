"""Tiers besides the hot LMDB store, and the policy that moves checkpoints between them.

Backends implement `vault.tier.Tier` (a local or mounted filesystem, an object store
through obstore: S3-compatible, GCS, Azure; memory for tests) and `open_tier` builds one
from a URL; retries and test faults are wrappers around any of them (`wrappers.py`).
The policy is here too: a pure plan over `Vault.snapshot()` of which checkpoints leave the
hot tier and which come back (`policy.py`), a run that applies it through `Vault.content`
and records each checkpoint's `tier` (`runner.py`), and repacking of sparse packs
(`repack.py`); GC followed by repack is a task of the maintenance package.
How chunks are packed, located and moved is the engine's (`vault/content/`); this package
never touches LMDB or the writer (tests/test_boundaries_content.py).
"""

from .backends.local import LocalTier
from .backends.memory import MemoryTier
from .registry import open_tier

__all__ = ["LocalTier", "MemoryTier", "open_tier"]
