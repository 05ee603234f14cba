"""Checkpoint Vault's storage engine: chunking, chunk frames, LMDB store and catalog.

No HTTP here; api/ wraps `Vault`. Public names are re-exported below.
"""

from .chunking import DEFAULT_PROFILE, PROFILES, ChunkingProfile, StreamChunker
from .clock import Clock, FakeClock, SystemClock
from .config import VaultConfig
from .direct import PreparedSave
from .errors import (
    CheckpointNotFound,
    ChunkCorrupt,
    Conflict,
    HashMismatch,
    InvalidName,
    InvalidRequest,
    MaintenanceBusy,
    MaintenanceStopped,
    MissingChunks,
    NotFound,
    TooLarge,
    TooManyUploads,
    Unavailable,
    UnsafePath,
    UploadExpired,
    UploadNotFound,
    VaultError,
    VaultInUse,
)
from .maintenance import MaintenanceLock
from .manifest import FileEntry
from .names import PARTS
from .records import NamespaceRecord, StoredCheckpoint, UploadSession
from .seal import Keyring
from .tokens import Token
from .vault import Vault

__all__ = [
    "DEFAULT_PROFILE",
    "PROFILES",
    "ChunkCorrupt",
    "CheckpointNotFound",
    "StoredCheckpoint",
    "ChunkingProfile",
    "Clock",
    "Conflict",
    "FakeClock",
    "FileEntry",
    "HashMismatch",
    "InvalidName",
    "InvalidRequest",
    "Keyring",
    "MaintenanceBusy",
    "MaintenanceStopped",
    "MaintenanceLock",
    "MissingChunks",
    "NamespaceRecord",
    "NotFound",
    "PARTS",
    "PreparedSave",
    "StreamChunker",
    "SystemClock",
    "TooLarge",
    "TooManyUploads",
    "Token",
    "Unavailable",
    "UploadExpired",
    "UploadNotFound",
    "UploadSession",
    "Vault",
    "VaultConfig",
    "VaultError",
    "UnsafePath",
    "VaultInUse",
]
