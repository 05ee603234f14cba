"""The client's exceptions: one class per wire error code, under `ClientError`.

Callers catch what they can act on (`NotFound`, `MissingChunks`, `Unavailable`...) and never
have to look at HTTP statuses. Which class answers which code is the protocol's error table
(protocol/_errors.py); `_BY_CODE` is built from it, so a code cannot be left out.
"""

from __future__ import annotations

from typing import Any

from checkpoint_vault.protocol import ERRORS, CodedError


class ClientError(CodedError):
    """Root of every error the client raises; `status` is the HTTP status of the answer
    that raised it (None when there was none)."""

    code = "client_error"
    retry_after: float | None = None  # seconds, when the server said when to ask again

    def __init__(self, message: str, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
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


class Fenced(Conflict):
    """The server was a primary whose standby has since been promoted: it refuses writes
    for good. Write to the new primary."""

    code = "fenced"


class TransactionAborted(Conflict):
    """A commit across namespaces was aborted: nothing of it is visible, and its uploads
    are open again, for a commit in a new transaction."""

    code = "transaction_aborted"


class ReadOnlyStandby(Conflict):
    """The server is a read-only standby: write to the primary (or promote this one)."""

    code = "read_only"


class PartGone(Conflict):
    """A part named by a commit across hosts is no longer held by its node; nothing was
    committed: save that part again."""

    code = "part_gone"


class UploadExpired(ClientError):
    code = "upload_expired"


class BodyTimeout(ClientError):
    """The server stopped waiting for the rest of a request body (`server.body_timeout`)."""

    code = "body_timeout"


class RequestTimeout(ClientError):
    """A file handed over on the local socket made no progress: its file system did not
    answer a read or write (a hung FUSE or network mount). Retrying reads it again."""

    code = "request_timeout"


class QuotaExceeded(ClientError):
    """A namespace group's storage quota is used up: delete checkpoints first."""

    code = "quota_exceeded"


class RateLimited(ClientError):
    """This token made more requests than its rate allows; `retry_after` says when to
    try again (the client's retry policy waits it out)."""

    code = "rate_limited"


class TooManyUploads(ClientError):
    code = "too_many_uploads"


class Unavailable(ClientError):
    code = "unavailable"


class PartUnavailable(Unavailable):
    """A commit across hosts could not have one of its parts now (its node is down, or
    the part is not in the shared tier yet); nothing was committed: retry the commit."""

    code = "part_unavailable"


class KeyUnavailable(Unavailable):
    """The server lacks the key the data was encrypted with: an operator must fix it."""

    code = "key_unavailable"


class ServerError(ClientError):
    code = "internal"


class CorruptChunk(ClientError):
    code = "corrupt_chunk"


class CorruptObject(ServerError):
    """Encrypted data on the server failed authentication."""

    code = "corrupt_object"


class TierError(ServerError):
    """A storage tier failed in a way retrying will not fix."""

    code = "tier_error"


class TierObjectMissing(TierError):
    """A storage tier lost an object the server's catalog points to."""

    code = "tier_object_missing"


def _by_code() -> dict[str, type[ClientError]]:
    """Every wire code of the protocol's table -> the class its `client` column names here;
    a table row without a class, or a class with another code, fails at import."""
    classes = {c.__name__: c for c in _subclasses(ClientError)}
    out: dict[str, type[ClientError]] = {}
    for spec in ERRORS:
        cls = classes[spec.client]
        if cls.code != spec.code:
            raise RuntimeError(f"{cls.__name__}.code is {cls.code!r}, the table says {spec.code}")
        out[spec.code] = cls
    return out


def _subclasses(cls: type[ClientError]) -> list[type[ClientError]]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


_BY_CODE: dict[str, type[ClientError]] = _by_code()


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
