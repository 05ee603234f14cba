"""`VaultClient`: the blocking face of `AsyncVaultClient`, for training loops and scripts.

Its methods are generated from the async client (client/_sync_generated.py, written by
`python -m checkpoint_vault.client._gen_sync`) on a small hand-written base
(client/_sync_base.py), so the two faces take the same arguments and cannot drift apart.
"""

from ._sync_generated import VaultClient

__all__ = ["VaultClient"]
