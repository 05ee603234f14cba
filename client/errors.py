"""The client's exceptions: one class per wire error code, under `ClientError`.

Callers catch what they can act on (`NotFound`, `MissingChunks`, `Unavailable`...) and never
have to look at HTTP statuses.
"""

from __future__ import annotations

from typing import Any


class ClientError(Exception):
    """Root of every error the client raises."""

    code = "client_error"
    retry_after: float | None = None  # seconds, when the server said when to ask again

    def __init__(self, message: str, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.body = body


class TransportError(ClientError):
    """The server could not be reached, even after retries."""

    code = "transport"


class IntegrityError(ClientError):
    """Bytes received do not match the hash the vault recorded for them."""

    code = "integrity"


class Unauthorized(ClientError):
    code = "unauthorized"


class Forbidden(ClientError):
    code = "forbidden"


class NotFound(ClientError):
    code = "not_found"


class InvalidName(ClientError):
    code = "invalid_name"


class InvalidRequest(ClientError):
    code = "invalid_request"


class InvalidRange(ClientError):
    code = "invalid_range"


class HashMismatch(ClientError):
    code = "hash_mismatch"


class TooLarge(ClientError):
    code = "too_large"


class Conflict(ClientError):
    code = "conflict"


class MissingChunks(Conflict):
    code = "missing_chunks"

    @property
    def missing(self) -> list[str]:
        err = self.body.get("error", {}) if isinstance(self.body, dict) else {}
        return list(err.get("missing", []))


class UploadExpired(ClientError):
    code = "upload_expired"


class TooManyUploads(ClientError):
    code = "too_many_uploads"


class Unavailable(ClientError):
    code = "unavailable"


class CorruptChunk(ClientError):
    code = "corrupt_chunk"


class ServerError(ClientError):
    code = "internal"


_BY_CODE: dict[str, type[ClientError]] = {
    cls.code: cls
    for cls in (
        Unauthorized,
        Forbidden,
        NotFound,
        InvalidName,
        InvalidRequest,
        InvalidRange,
        HashMismatch,
        TooLarge,
        Conflict,
        MissingChunks,
        UploadExpired,
        TooManyUploads,
        Unavailable,
        CorruptChunk,
        ServerError,
    )
}


def error_from(status: int, body: Any) -> ClientError:
    """The exception for an error answer: by its wire code, else by its status."""
    err = body.get("error") if isinstance(body, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    message = err.get("message") if isinstance(err, dict) else None
    cls = _BY_CODE.get(str(code))
    if cls is None:
        cls = {
            401: Unauthorized,
            403: Forbidden,
            404: NotFound,
            409: Conflict,
            410: UploadExpired,
            413: TooLarge,
            503: Unavailable,
        }.get(status, ServerError)
    return cls(str(message or f"HTTP {status}"), status, body)
