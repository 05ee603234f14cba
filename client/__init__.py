"""What producers import to talk to a Checkpoint Vault server.

    from checkpoint_vault.client import VaultClient
    with VaultClient() as vault:                 # CKPT_URL / CKPT_TOKEN, or the defaults
        ckpt = vault.save("runs/exp1", "checkpoints/step-1000", metadata={"step": 1000})
        vault.load("runs/exp1", "latest-valid", dest="restore/")

Importing this package stays light: no server dependencies (lmdb, zstandard), and the names
below load on first use (PEP 562), so the server importing `protocol` pulls in no
client machinery.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from checkpoint_vault.protocol import ERROR_CODES

    from .aio import AsyncVaultClient
    from .errors import (
        ClientError,
        Conflict,
        CorruptChunk,
        CorruptObject,
        Fenced,
        Forbidden,
        HashMismatch,
        IntegrityError,
        InvalidName,
        InvalidRange,
        InvalidRequest,
        KeyUnavailable,
        MissingChunks,
        NotFound,
        PartGone,
        PartUnavailable,
        ReadOnlyStandby,
        ServerError,
        TierError,
        TierObjectMissing,
        TooLarge,
        TooManyUploads,
        TransactionAborted,
        TransportError,
        Unauthorized,
        Unavailable,
        UploadExpired,
    )
    from .manager import CheckpointManager
    from .models import Checkpoint, Transfer
    from .options import SaveFields, SaveOptions
    from .sync import VaultClient
    from .transport import RetryPolicy

_LAZY = {
    "AsyncVaultClient": ".aio",
    "ClientError": ".errors",
    "Conflict": ".errors",
    "CorruptChunk": ".errors",
    "CorruptObject": ".errors",
    "Fenced": ".errors",
    "Forbidden": ".errors",
    "HashMismatch": ".errors",
    "IntegrityError": ".errors",
    "InvalidName": ".errors",
    "InvalidRange": ".errors",
    "InvalidRequest": ".errors",
    "KeyUnavailable": ".errors",
    "MissingChunks": ".errors",
    "NotFound": ".errors",
    "PartGone": ".errors",
    "PartUnavailable": ".errors",
    "ReadOnlyStandby": ".errors",
    "ServerError": ".errors",
    "TierError": ".errors",
    "TierObjectMissing": ".errors",
    "TooLarge": ".errors",
    "TooManyUploads": ".errors",
    "TransactionAborted": ".errors",
    "TransportError": ".errors",
    "Unauthorized": ".errors",
    "Unavailable": ".errors",
    "UploadExpired": ".errors",
    "CheckpointManager": ".manager",
    "Checkpoint": ".models",
    "Transfer": ".models",
    "SaveFields": ".options",
    "SaveOptions": ".options",
    "ERROR_CODES": "protocol",
    "VaultClient": ".sync",
    "RetryPolicy": ".transport",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "ERROR_CODES",
    "AsyncVaultClient",
    "Checkpoint",
    "CheckpointManager",
    "ClientError",
    "Conflict",
    "CorruptChunk",
    "CorruptObject",
    "Fenced",
    "Forbidden",
    "HashMismatch",
    "IntegrityError",
    "InvalidName",
    "InvalidRange",
    "InvalidRequest",
    "KeyUnavailable",
    "MissingChunks",
    "NotFound",
    "PartGone",
    "PartUnavailable",
    "ReadOnlyStandby",
    "RetryPolicy",
    "SaveFields",
    "SaveOptions",
    "ServerError",
    "TierError",
    "TierObjectMissing",
    "TooLarge",
    "TooManyUploads",
    "TransactionAborted",
    "Transfer",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "UploadExpired",
    "VaultClient",
]
