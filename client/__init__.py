"""What producers import to talk to a Checkpoint Vault server.

Importing this package must stay light: no server dependencies (lmdb, zstandard).
"""

from .wire import ERROR_CODES

__all__ = ["ERROR_CODES"]
