"""S3 error codes, and the one table that turns engine errors into them.

The S3 endpoint answers errors the way S3 does (an `<Error>` XML document with a `Code`
clients branch on), not the JSON API's `{"error": {...}}`: SDKs map `NoSuchKey` to
"file not found", `SlowDown` to a retry, `AccessDenied` to a permission error. Handlers
raise `S3Error` or let engine errors through; `s3_error_middleware` (api/s3/app.py) maps
both, so no handler builds an error response.
"""

from __future__ import annotations

from checkpoint_vault.vault import VaultError
from checkpoint_vault.vault.errors import (
    ChunkCorrupt,
    Conflict,
    HashMismatch,
    InvalidName,
    InvalidRequest,
    NotFound,
    NotPermitted,
    QuotaExceeded,
    TooLarge,
    TooManyUploads,
    Unavailable,
    UploadExpired,
)


class S3Error(Exception):
    """One S3 error answer: its `code`, HTTP `status` and a message for a person."""

    def __init__(
        self,
        code: str,
        status: int,
        message: str,
        resource: str = "",
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.message = message
        self.resource = resource
        self.retry_after = retry_after  # seconds, sent as Retry-After (a part node down)


def access_denied(message: str) -> S3Error:
    return S3Error("AccessDenied", 403, message)


def no_such_key(key: str) -> S3Error:
    return S3Error("NoSuchKey", 404, "The specified key does not exist.", key)


def invalid_argument(message: str) -> S3Error:
    return S3Error("InvalidArgument", 400, message)


def not_implemented(what: str) -> S3Error:
    return S3Error("NotImplemented", 501, f"{what} is not implemented by this endpoint")


# Engine errors by class, most specific first: (S3 code, HTTP status).
_TABLE: tuple[tuple[type[VaultError], str, int], ...] = (
    (InvalidName, "InvalidArgument", 400),
    (InvalidRequest, "InvalidArgument", 400),
    (HashMismatch, "BadDigest", 400),
    (TooLarge, "EntityTooLarge", 400),
    (NotFound, "NoSuchKey", 404),
    (UploadExpired, "NoSuchUpload", 404),
    (NotPermitted, "AccessDenied", 403),
    (QuotaExceeded, "QuotaExceeded", 403),
    (TooManyUploads, "SlowDown", 503),
    (Conflict, "OperationAborted", 409),
    (Unavailable, "ServiceUnavailable", 503),
    (ChunkCorrupt, "InternalError", 500),
)


def from_vault(error: VaultError) -> S3Error:
    """The S3 answer to an engine error (the message says what happened, in the engine's
    words; storage paths never reach it, vault/errors.py)."""
    for cls, code, status in _TABLE:
        if isinstance(error, cls):
            return S3Error(
                code, status, str(error), retry_after=getattr(error, "retry_after", None)
            )
    return S3Error("InternalError", 500, "We encountered an internal error. Please try again.")
