"""The JSON records of the HTTP API, one frozen dataclass each, all on the field-driven
`Record` (protocol/_wire.py).

The server builds its answers with these (vault/records.py converts its storage records into
them), the client parses answers with them (client/models.py wraps `CheckpointRecord`), and
api/routes/openapi.py derives the OpenAPI schemas from their fields and type hints. So a field is
added in one place and appears in the server's JSON, the client's parse and the document.
`from_wire` raises `ValueError` on a malformed record. Times on the wire are RFC 3339
strings; arbitrary JSON (metadata) is typed `JSON`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

from ._errors import ERRORS
from ._wire import Record, optional

# Arbitrary JSON, genuinely untyped: checkpoint metadata values and policy bodies.
JSON = Any
JSONObject = dict[str, JSON]

VALIDITY_STATES = ("unverified", "valid", "invalid")

# Field metadata read by api/routes/openapi.py when it derives the schemas: "schema" is merged into
# the field's derived JSON schema; "optional" fields may be absent from the JSON.
_TIME: dict[str, Any] = {"schema": {"format": "date-time"}}


@dataclass(frozen=True)
class Validity(Record):
    """Whether a checkpoint is fit to restore, who said so and when."""

    state: str = field(default="unverified", metadata={"schema": {"enum": list(VALIDITY_STATES)}})
    reason: str | None = None
    source: str | None = None  # "producer" (PATCH) or "scrub"
    at: str | None = field(default=None, metadata=_TIME)


@dataclass(frozen=True)
class FileInfo(Record):
    """A file of a checkpoint record: its size and whole-file BLAKE3 (hex)."""

    size: int
    hash: str


@dataclass(frozen=True)
class CheckpointRecord(Record):
    """A live checkpoint as every route answers it."""

    id: str
    namespace: str
    parent: str | None
    created_at: str = field(metadata=_TIME)
    metadata: JSONObject = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    pinned: bool = False
    validity: Validity = field(default_factory=Validity)
    files: dict[str, FileInfo] = field(default_factory=dict)
    size: int = 0
    tier: str = "hot"
    # False while some file's chunks are still only on the node of the part that saved it
    # (a commit of parts that did not wait for shipping); true for every other checkpoint.
    durable: bool = True


@dataclass(frozen=True)
class TombstoneRecord(Record):
    """A deleted checkpoint as lineage shows it: it keeps its place in the chain."""

    id: str
    namespace: str
    parent: str | None
    created_at: str = field(metadata=_TIME)
    deleted_at: str = field(metadata=_TIME)
    deleted: bool = True


# A lineage entry: a live checkpoint or a tombstone, told apart by `deleted`.
LineageEntry = Union[CheckpointRecord, TombstoneRecord]  # noqa: UP007 (a runtime alias)


def lineage_entry_from_wire(d: object) -> LineageEntry:
    if isinstance(d, dict) and d.get("deleted"):
        return TombstoneRecord.from_wire(d)
    return CheckpointRecord.from_wire(d)


@dataclass(frozen=True)
class ChunkSpan(Record):
    """One chunk of a file in a manifest: its id and where it sits in the file."""

    id: str
    offset: int
    size: int


@dataclass(frozen=True)
class ManifestFile(Record):
    """A file of a manifest: size, whole-file hash and its chunks in order."""

    size: int
    hash: str
    chunks: list[ChunkSpan] = field(default_factory=list)


@dataclass(frozen=True)
class Manifest(Record):
    """GET .../manifest: every file with its chunk list, for parallel range reads."""

    id: str
    files: dict[str, ManifestFile] = field(default_factory=dict)


@dataclass(frozen=True)
class NamespaceEntry(Record):
    """One namespace of GET /v1/namespaces."""

    name: str
    checkpoints: int
    latest: str | None
    logical_bytes: int
    chunking: JSONObject  # ChunkingProfile.to_wire()


@dataclass(frozen=True)
class BulkDeleted(Record):
    """The answer to DELETE /v1/namespaces/{ns}/checkpoints: what went, what a pin kept,
    and requested ids that were unknown or already deleted."""

    deleted: list[str]
    pinned: list[str]
    not_found: list[str]


@dataclass(frozen=True)
class UploadOpened(Record):
    """The answer to POST .../uploads: the session and the chunking every writer must use."""

    upload_id: str
    namespace: str
    parent: str | None
    expires_at: str = field(metadata=_TIME)
    chunking: JSONObject  # ChunkingProfile.to_wire()


@dataclass(frozen=True)
class FileStored(Record):
    """The answer to PUT /v1/uploads/{id}/files/{name}: the server chunked and stored it."""

    name: str
    size: int
    hash: str
    chunks: int


@dataclass(frozen=True)
class CommitFile(Record):
    """A file listed in a commit body: size, whole-file hash and chunk ids in order. The
    hash may be left out (None): the server, which verified every chunk against its id,
    computes it; given, it must match."""

    size: int
    hash: str | None = field(metadata={"optional": True})
    chunks: list[str]


@dataclass(frozen=True)
class ErrorBody(Record):
    """The object of every error answer, `{"error": ErrorBody}` (api/errors.py wraps it;
    the codes are ERRORS')."""

    code: str = field(metadata={"schema": {"enum": [e.code for e in ERRORS]}})
    message: str
    # missing_chunks only: the chunk ids not stored.
    missing: list[str] | None = optional()
