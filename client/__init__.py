"""What producers import to talk to a Checkpoint Vault server.

    from client import VaultClient
    with VaultClient() as vault:                 # CKPT_URL / CKPT_TOKEN, or the defaults
        ckpt = vault.save("runs/exp1", "checkpoints/step-1000", metadata={"step": 1000})
        vault.load("runs/exp1", "latest-valid", dest="restore/")

Importing this package stays light: no server dependencies (lmdb, zstandard).
"""

from .aio import AsyncVaultClient
from .errors import (
    ClientError,
    Conflict,
    CorruptChunk,
    Forbidden,
    HashMismatch,
    IntegrityError,
    InvalidName,
    InvalidRange,
    InvalidRequest,
    MissingChunks,
    NotFound,
    ServerError,
    TooLarge,
    TransportError,
    Unauthorized,
    Unavailable,
    UploadExpired,
)
from .models import Checkpoint, Transfer
from .options import SaveFields, SaveOptions
from .sync import VaultClient
from .transport import RetryPolicy
from .wire import ERROR_CODES

__all__ = [
    "ERROR_CODES",
    "AsyncVaultClient",
    "Checkpoint",
    "ClientError",
    "Conflict",
    "CorruptChunk",
    "Forbidden",
    "HashMismatch",
    "IntegrityError",
    "InvalidName",
    "InvalidRange",
    "InvalidRequest",
    "MissingChunks",
    "NotFound",
    "RetryPolicy",
    "SaveFields",
    "SaveOptions",
    "ServerError",
    "TooLarge",
    "Transfer",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "UploadExpired",
    "VaultClient",
]
