"""The JSON records of the HTTP API, one frozen dataclass each, with `to_wire`/`from_wire`.

The server builds its answers with these (vault/records.py converts its storage records into
them), the client parses answers with them (client/models.py wraps `CheckpointRecord`), and
api/openapi.py derives the OpenAPI schemas from their fields and type hints. So a field is
added in one place and appears in the server's JSON, the client's parse and the document.
`from_wire` raises `ValueError` on a malformed record. Times on the wire are RFC 3339
strings; arbitrary JSON (metadata) is typed `JSON`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from ._errors import ERRORS

# Arbitrary JSON, genuinely untyped: checkpoint metadata values and policy bodies.
JSON = Any
JSONObject = dict[str, JSON]

VALIDITY_STATES = ("unverified", "valid", "invalid")

# Field metadata read by api/openapi.py when it derives the schemas: "schema" is merged into
# the field's derived JSON schema; "optional" fields may be absent from the JSON.
_TIME: dict[str, Any] = {"schema": {"format": "date-time"}}
_OPTIONAL: dict[str, Any] = {"optional": True}


def _obj(d: object, what: str) -> Mapping[str, Any]:
    if not isinstance(d, Mapping):
        raise ValueError(f"{what} must be a JSON object")
    return d


def _str(d: Mapping[str, Any], key: str, what: str) -> str:
    v = d.get(key)
    if not isinstance(v, str):
        raise ValueError(f"{what}.{key} must be a string")
    return v


def _opt_str(d: Mapping[str, Any], key: str, what: str) -> str | None:
    v = d.get(key)
    if v is not None and not isinstance(v, str):
        raise ValueError(f"{what}.{key} must be a string or null")
    return v


def _int(d: Mapping[str, Any], key: str, what: str) -> int:
    v = d.get(key)
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"{what}.{key} must be an integer")
    return v


@dataclass(frozen=True)
class Validity:
    """Whether a checkpoint is fit to restore, who said so and when."""

    state: str = field(default="unverified", metadata={"schema": {"enum": list(VALIDITY_STATES)}})
    reason: str | None = None
    source: str | None = None  # "producer" (PATCH) or "scrub"
    at: str | None = field(default=None, metadata=_TIME)

    def to_wire(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason, "source": self.source, "at": self.at}

    @classmethod
    def from_wire(cls, d: object) -> Validity:
        m = _obj(d or {}, "validity")
        state = m.get("state", "unverified")
        if state not in VALIDITY_STATES:
            raise ValueError(f"validity.state must be one of {', '.join(VALIDITY_STATES)}")
        return cls(
            state, _opt_str(m, "reason", "validity"), _opt_str(m, "source", "validity"),
            _opt_str(m, "at", "validity"),
        )  # fmt: skip


@dataclass(frozen=True)
class FileInfo:
    """A file of a checkpoint record: its size and whole-file BLAKE3 (hex)."""

    size: int
    hash: str

    def to_wire(self) -> dict[str, Any]:
        return {"size": self.size, "hash": self.hash}

    @classmethod
    def from_wire(cls, d: object) -> FileInfo:
        m = _obj(d, "file")
        return cls(_int(m, "size", "file"), _str(m, "hash", "file"))


@dataclass(frozen=True)
class CheckpointRecord:
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

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "namespace": self.namespace,
            "parent": self.parent,
            "created_at": self.created_at,
            "metadata": self.metadata,
            "tags": self.tags,
            "pinned": self.pinned,
            "validity": self.validity.to_wire(),
            "files": {n: f.to_wire() for n, f in self.files.items()},
            "size": self.size,
            "tier": self.tier,
        }

    @classmethod
    def from_wire(cls, d: object) -> CheckpointRecord:
        m = _obj(d, "checkpoint")
        metadata = m.get("metadata") or {}
        tags = m.get("tags") or []
        files = _obj(m.get("files") or {}, "checkpoint.files")
        if not isinstance(metadata, dict):
            raise ValueError("checkpoint.metadata must be an object")
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise ValueError("checkpoint.tags must be a list of strings")
        return cls(
            id=_str(m, "id", "checkpoint"),
            namespace=_str(m, "namespace", "checkpoint"),
            parent=_opt_str(m, "parent", "checkpoint"),
            created_at=str(m.get("created_at", "")),
            metadata=metadata,
            tags=list(tags),
            pinned=bool(m.get("pinned", False)),
            validity=Validity.from_wire(m.get("validity")),
            files={str(n): FileInfo.from_wire(f) for n, f in files.items()},
            size=int(m.get("size", 0)),
            tier=str(m.get("tier", "hot")),
        )


@dataclass(frozen=True)
class TombstoneRecord:
    """A deleted checkpoint as lineage shows it: it keeps its place in the chain."""

    id: str
    namespace: str
    parent: str | None
    created_at: str = field(metadata=_TIME)
    deleted_at: str = field(metadata=_TIME)
    deleted: bool = True

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "namespace": self.namespace,
            "parent": self.parent,
            "created_at": self.created_at,
            "deleted": True,
            "deleted_at": self.deleted_at,
        }

    @classmethod
    def from_wire(cls, d: object) -> TombstoneRecord:
        m = _obj(d, "tombstone")
        return cls(
            _str(m, "id", "tombstone"), _str(m, "namespace", "tombstone"),
            _opt_str(m, "parent", "tombstone"), str(m.get("created_at", "")),
            str(m.get("deleted_at", "")),
        )  # fmt: skip


# A lineage entry: a live checkpoint or a tombstone, told apart by `deleted`.
LineageEntry = Union[CheckpointRecord, TombstoneRecord]  # noqa: UP007 (a runtime alias)


def lineage_entry_from_wire(d: object) -> LineageEntry:
    m = _obj(d, "lineage entry")
    return TombstoneRecord.from_wire(m) if m.get("deleted") else CheckpointRecord.from_wire(m)


@dataclass(frozen=True)
class ChunkSpan:
    """One chunk of a file in a manifest: its id and where it sits in the file."""

    id: str
    offset: int
    size: int

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "offset": self.offset, "size": self.size}

    @classmethod
    def from_wire(cls, d: object) -> ChunkSpan:
        m = _obj(d, "chunk")
        return cls(_str(m, "id", "chunk"), _int(m, "offset", "chunk"), _int(m, "size", "chunk"))


@dataclass(frozen=True)
class ManifestFile:
    """A file of a manifest: size, whole-file hash and its chunks in order."""

    size: int
    hash: str
    chunks: list[ChunkSpan] = field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        return {"size": self.size, "hash": self.hash, "chunks": [c.to_wire() for c in self.chunks]}

    @classmethod
    def from_wire(cls, d: object) -> ManifestFile:
        m = _obj(d, "manifest file")
        chunks = m.get("chunks") or []
        if not isinstance(chunks, list):
            raise ValueError("manifest file.chunks must be a list")
        return cls(
            _int(m, "size", "manifest file"),
            _str(m, "hash", "manifest file"),
            [ChunkSpan.from_wire(c) for c in chunks],
        )


@dataclass(frozen=True)
class Manifest:
    """GET .../manifest: every file with its chunk list, for parallel range reads."""

    id: str
    files: dict[str, ManifestFile] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "files": {n: f.to_wire() for n, f in self.files.items()}}

    @classmethod
    def from_wire(cls, d: object) -> Manifest:
        m = _obj(d, "manifest")
        files = _obj(m.get("files") or {}, "manifest.files")
        return cls(
            _str(m, "id", "manifest"), {str(n): ManifestFile.from_wire(f) for n, f in files.items()}
        )


@dataclass(frozen=True)
class NamespaceEntry:
    """One namespace of GET /v1/namespaces."""

    name: str
    checkpoints: int
    latest: str | None
    logical_bytes: int
    chunking: JSONObject  # ChunkingProfile.to_wire()

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "checkpoints": self.checkpoints,
            "latest": self.latest,
            "logical_bytes": self.logical_bytes,
            "chunking": self.chunking,
        }

    @classmethod
    def from_wire(cls, d: object) -> NamespaceEntry:
        m = _obj(d, "namespace")
        return cls(
            _str(m, "name", "namespace"), _int(m, "checkpoints", "namespace"),
            _opt_str(m, "latest", "namespace"), _int(m, "logical_bytes", "namespace"),
            dict(_obj(m.get("chunking") or {}, "namespace.chunking")),
        )  # fmt: skip


def _str_list(d: Mapping[str, Any], key: str, what: str) -> list[str]:
    v = d.get(key)
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ValueError(f"{what}.{key} must be a list of strings")
    return list(v)


@dataclass(frozen=True)
class BulkDeleted:
    """The answer to DELETE /v1/namespaces/{ns}/checkpoints: what went, what a pin kept,
    and requested ids that were unknown or already deleted."""

    deleted: list[str]
    pinned: list[str]
    not_found: list[str]

    def to_wire(self) -> dict[str, Any]:
        return {"deleted": self.deleted, "pinned": self.pinned, "not_found": self.not_found}

    @classmethod
    def from_wire(cls, d: object) -> BulkDeleted:
        m = _obj(d, "bulk delete")
        return cls(
            _str_list(m, "deleted", "bulk delete"),
            _str_list(m, "pinned", "bulk delete"),
            _str_list(m, "not_found", "bulk delete"),
        )


@dataclass(frozen=True)
class UploadOpened:
    """The answer to POST .../uploads: the session and the chunking every writer must use."""

    upload_id: str
    namespace: str
    parent: str | None
    expires_at: str = field(metadata=_TIME)
    chunking: JSONObject  # ChunkingProfile.to_wire()

    def to_wire(self) -> dict[str, Any]:
        return {
            "upload_id": self.upload_id,
            "namespace": self.namespace,
            "parent": self.parent,
            "expires_at": self.expires_at,
            "chunking": self.chunking,
        }

    @classmethod
    def from_wire(cls, d: object) -> UploadOpened:
        m = _obj(d, "upload")
        return cls(
            _str(m, "upload_id", "upload"), _str(m, "namespace", "upload"),
            _opt_str(m, "parent", "upload"), str(m.get("expires_at", "")),
            dict(_obj(m.get("chunking") or {}, "upload.chunking")),
        )  # fmt: skip


@dataclass(frozen=True)
class FileStored:
    """The answer to PUT /v1/uploads/{id}/files/{name}: the server chunked and stored it."""

    name: str
    size: int
    hash: str
    chunks: int

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "hash": self.hash, "chunks": self.chunks}

    @classmethod
    def from_wire(cls, d: object) -> FileStored:
        m = _obj(d, "file")
        return cls(
            _str(m, "name", "file"), _int(m, "size", "file"), _str(m, "hash", "file"),
            _int(m, "chunks", "file"),
        )  # fmt: skip


@dataclass(frozen=True)
class CommitFile:
    """A file listed in a commit body: size, whole-file hash and chunk ids in order. The
    hash may be left out (None): the server, which verified every chunk against its id,
    computes it; given, it must match."""

    size: int
    hash: str | None = field(metadata=_OPTIONAL)
    chunks: list[str]

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"size": self.size, "chunks": self.chunks}
        if self.hash is not None:
            wire["hash"] = self.hash
        return wire

    @classmethod
    def from_wire(cls, d: object) -> CommitFile:
        m = _obj(d, "file")
        chunks = m.get("chunks")
        if not isinstance(chunks, list) or not all(isinstance(c, str) for c in chunks):
            raise ValueError("file.chunks must be a list of chunk ids")
        return cls(_int(m, "size", "file"), _opt_str(m, "hash", "file"), list(chunks))


@dataclass(frozen=True)
class ErrorBody:
    """Every error answer: `{"error": {"code", "message", ...extra}}` (see ERRORS)."""

    code: str = field(metadata={"schema": {"enum": [e.code for e in ERRORS]}})
    message: str
    # missing_chunks only: the chunk ids not stored.
    missing: list[str] | None = field(default=None, metadata=_OPTIONAL)

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.missing is not None:
            body["missing"] = self.missing
        return {"error": body}

    @classmethod
    def from_wire(cls, d: object) -> ErrorBody:
        err = _obj(_obj(d, "error body").get("error"), "error")
        missing = err.get("missing")
        return cls(
            str(err.get("code", "")),
            str(err.get("message", "")),
            [str(c) for c in missing] if isinstance(missing, list) else None,
        )
