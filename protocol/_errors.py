"""The error table: every wire error code, its HTTP status and the class raising it per side.

This is the one declaration of the error contract. `vault/errors.py` and `api/errors.py` take
each class's `status` from it by code, `client/errors.py` maps every code to a class from it,
docs/API.md's error table is checked against it, and tests/test_boundaries.py proves that
every code the server can emit is listed here with a specific client class.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar, TypeVar


@dataclass(frozen=True)
class ErrorSpec:
    """One wire error code: `{"error": {"code": code, "message": ...}}` with `status`."""

    code: str
    status: int
    client: str  # the class in client/errors.py raised for this code
    server: tuple[str, ...]  # the classes in vault/ or api/ that emit it (several may share)
    meaning: str


ERRORS: tuple[ErrorSpec, ...] = (
    ErrorSpec("unauthorized", 401, "Unauthorized", ("Unauthorized",), "missing or unknown token"),
    ErrorSpec(
        "forbidden",
        403,
        "Forbidden",
        ("Forbidden", "NotPermitted"),
        "token lacks the needed scope, or is append-only (write without delete)",
    ),
    ErrorSpec(
        "not_found",
        404,
        "NotFound",
        (
            "NotFound",
            "NamespaceNotFound",
            "CheckpointNotFound",
            "UploadNotFound",
            "BlockNotFound",
            "ReplicaNotFound",
        ),
        "a namespace, checkpoint, upload, file or chunk does not exist",
    ),
    ErrorSpec("invalid_name", 400, "InvalidName", ("InvalidName",), "a malformed name"),
    ErrorSpec(
        "invalid_request",
        400,
        "InvalidRequest",
        ("InvalidRequest", "ApiError"),
        "a malformed request",
    ),
    ErrorSpec("invalid_range", 416, "InvalidRange", ("InvalidRange",), "unsatisfiable Range"),
    ErrorSpec(
        "hash_mismatch", 400, "HashMismatch", ("HashMismatch",), "bytes do not match their hash"
    ),
    ErrorSpec("too_large", 413, "TooLarge", ("TooLarge",), "a body over the configured limit"),
    ErrorSpec(
        "missing_chunks",
        409,
        "MissingChunks",
        ("MissingChunks",),
        "a commit names chunks not stored (the body lists them under `missing`)",
    ),
    ErrorSpec(
        "conflict",
        409,
        "Conflict",
        (
            "Conflict",
            "ObjectExists",
            "MaintenanceBusy",
            "VaultInUse",
            "PromotionConflict",
            "UnsafePath",
            "UploadPrepared",
        ),
        "contradicts current state (pinned, committed, maintenance busy, ...)",
    ),
    ErrorSpec(
        "transaction_aborted",
        409,
        "TransactionAborted",
        ("TransactionAborted",),
        "a commit across namespaces was aborted (an upload refused, or one stayed prepared "
        "past its timeout undecided): nothing of it is visible, its uploads are open again",
    ),
    ErrorSpec(
        "read_only",
        409,
        "ReadOnlyStandby",
        ("ReadOnlyStandby",),
        "this server is a read-only standby: write to the primary, or promote this one",
    ),
    ErrorSpec(
        "fenced",
        409,
        "Fenced",
        ("Fenced", "ClusterConflict"),
        "this server was a primary and a standby has been promoted past it, or another node "
        "of the cluster holds its shard: it takes no more writes (write to the new primary)",
    ),
    ErrorSpec(
        "part_gone",
        409,
        "PartGone",
        ("PartGone",),
        "a part named by a commit across hosts is not held by its node (released, expired, "
        "or lost); nothing was committed: save that part again",
    ),
    ErrorSpec(
        "upload_expired", 410, "UploadExpired", ("UploadExpired",), "the upload session expired"
    ),
    ErrorSpec(
        "body_timeout", 408, "BodyTimeout", ("BodyTimeout",), "the request body stopped arriving"
    ),
    ErrorSpec(
        "request_timeout",
        408,
        "RequestTimeout",
        ("RequestTimeout",),
        "a file handed over made no progress (its file system does not answer a read or "
        "write); the server stopped waiting for it",
    ),
    ErrorSpec(
        "quota_exceeded",
        507,
        "QuotaExceeded",
        ("QuotaExceeded",),
        "the namespaces' storage quota is used up",
    ),
    ErrorSpec(
        "rate_limited", 429, "RateLimited", ("RateLimited",), "this token is over its request rate"
    ),
    ErrorSpec(
        "too_many_uploads",
        429,
        "TooManyUploads",
        ("TooManyUploads",),
        "too many open upload sessions",
    ),
    ErrorSpec(
        "unavailable",
        503,
        "Unavailable",
        (
            "Unavailable",
            "TierUnavailable",
            "MaintenanceStopped",
            "NotTheWriter",
            "Busy",
            "NotOwner",
        ),
        "a tier or the store is down, the server is stopping, one of its processes passes "
        "as many requests to the one that writes as it may, or a cluster's shard has no live "
        "owner for a moment: retry later (Retry-After)",
    ),
    ErrorSpec(
        "part_unavailable",
        503,
        "PartUnavailable",
        ("PartUnavailable", "PartNotShipped"),
        "a commit across hosts cannot have one of its parts now (its node does not answer, "
        "or its chunks are not in the shared tier yet); nothing was committed: retry",
    ),
    ErrorSpec(
        "key_unavailable",
        503,
        "KeyUnavailable",
        ("KeyUnavailable",),
        "data is encrypted with a key this server was not given",
    ),
    ErrorSpec("corrupt_chunk", 500, "CorruptChunk", ("ChunkCorrupt",), "a stored chunk is damaged"),
    ErrorSpec(
        "corrupt_object",
        500,
        "CorruptObject",
        ("SealBroken",),
        "encrypted data failed authentication",
    ),
    ErrorSpec("tier_error", 500, "TierError", ("TierError",), "a tier failed permanently"),
    ErrorSpec(
        "tier_object_missing",
        500,
        "TierObjectMissing",
        ("ObjectNotFound",),
        "a tier lost an object the catalog points to",
    ),
    ErrorSpec("internal", 500, "ServerError", ("VaultError",), "a bug: see the request id"),
)

ERROR_SPECS: dict[str, ErrorSpec] = {e.code: e for e in ERRORS}
# code -> HTTP status, the form most callers need.
ERROR_CODES: dict[str, int] = {e.code: e.status for e in ERRORS}


def status_of(code: str) -> int:
    """The HTTP status of a wire code; KeyError for a code missing from the table, so a class
    declaring a new code fails at import until the table lists it."""
    return ERROR_CODES[code]


class CodedError(Exception):
    """The root the engine's (`VaultError`), the service's (`ApiError`) and the client's
    (`ClientError`) error trees share: each class names its stable wire `code`, and an error
    carries its message as given. Declared once here, on the floor server and client both
    stand on, so the three trees cannot drift apart in how a code or a message is held."""

    code: ClassVar[str] = "internal"
    status: int | None = None  # a server class's is its code's; a client error's, the answer's

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


E = TypeVar("E", bound="TabledError")  # a class of the tree `of_code` searches


class TabledError(CodedError):
    """A server-side coded error: its HTTP `status` is the error table's for its `code`, set
    on every subclass as it is declared, so a code missing from the table fails at import."""

    status: int = status_of(CodedError.code)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.status = status_of(cls.code)

    @classmethod
    def of_code(cls: type[E], code: str, name: str = "") -> type[E] | None:
        """The class of this tree (this one included) that another process's error of wire
        `code` is raised as here: the one called `name` among the classes of that code,
        else the code's most general class; None if no class of the tree declares the code.
        Only ever a class of the tree, so nothing a peer sends picks any other class."""
        of_code = [c for c in _tree(cls) if c.code == code]
        named = [c for c in of_code if c.__name__ == name]
        return named[0] if named else min(of_code, key=lambda c: len(c.__mro__), default=None)

    @classmethod
    def rebuilt(cls: type[E], message: str) -> E:
        """An error of this class holding `message` alone, as another process answered it:
        the class's own `__init__` (which may want more, a `MissingChunks`'s list) is not
        run; the caller sets what else it has."""
        error = cls.__new__(cls)
        CodedError.__init__(error, message)
        return error


def _tree(root: type[E]) -> Iterator[type[E]]:
    yield root
    for sub in root.__subclasses__():
        yield from _tree(sub)
