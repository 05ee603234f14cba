"""Catalog records: checkpoints (and their tombstones), namespaces and upload sessions.

Stored as JSON in LMDB: small, self-describing, and easy to extend with new fields without a
migration; the large part of a checkpoint, its manifest, has its own binary form. This is the
storage form (float times, scrub's `previous` state, `promoted_at`); what the API answers is
the protocol's record (protocol), built by `to_protocol`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from checkpoint_vault import protocol
from checkpoint_vault.protocol import VALIDITY_STATES, JSONObject

from .chunking import ChunkingProfile
from .clock import rfc3339
from .manifest import FileEntry

__all__ = ["VALIDITY_STATES", "StoredCheckpoint", "NamespaceRecord", "UploadSession", "Validity"]


@dataclass
class Validity:
    state: str = "unverified"
    reason: str | None = None
    source: str | None = None
    at: float | None = None
    previous: str | None = None  # the state scrub replaced, restored when the chunk heals

    def to_protocol(self) -> protocol.Validity:
        at = rfc3339(self.at) if self.at is not None else None
        return protocol.Validity(self.state, self.reason, self.source, at)


@dataclass
class StoredCheckpoint:
    id: str
    namespace: str
    parent: str | None
    created_at: float
    metadata: JSONObject
    tags: list[str]
    files: dict[str, dict[str, Any]]  # name -> {"size", "hash"}: protocol.FileInfo's wire form
    size: int
    pinned: bool = False
    validity: Validity = field(default_factory=Validity)
    tier: str = "hot"
    deleted_at: float | None = None  # set on tombstones
    promoted_at: float | None = None  # last brought back hot by a read; ages from here
    created_by: str | None = None  # token name that made it (append-only rules; audit)
    # False: a commit of parts whose chunks are not all adopted here yet (vault/pending.py)
    durable: bool = True
    # Stored without `files` (the catalog fills them from the manifest's entries): not a
    # stored field itself.
    files_elided: bool = field(default=False, compare=False, repr=False)

    @property
    def is_tombstone(self) -> bool:
        return self.deleted_at is not None

    def set_files(self, entries: Mapping[str, FileEntry]) -> None:
        """`files` (name -> size and hex hash, by name) from the files' entries: by the
        catalog at commit, and by a worker from the save it prepared when the writing
        process answers without them (node/calls.py)."""
        self.files = {n: {"size": e.size, "hash": e.hash.hex()} for n, e in sorted(entries.items())}
        self.files_elided = False

    def to_json(self, with_files: bool = True) -> bytes:
        """`with_files=False`: for a catalog that can rebuild `files` from the manifest."""
        # Built by hand: dataclasses.asdict deep-copies metadata and files on every commit.
        fields = {f: getattr(self, f) for f in _RECORD_FIELDS if with_files or f != "files"}
        fields["validity"] = self.validity.__dict__
        if self.durable:  # the default, as every record before parts had it: not stored
            del fields["durable"]
        return json.dumps(fields, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes | memoryview) -> StoredCheckpoint:
        d = json.loads(bytes(raw))
        d["validity"] = Validity(**d["validity"])
        if "files" not in d:
            d["files"], d["files_elided"] = {}, True
        return cls(**d)

    def to_protocol(self) -> protocol.LineageEntry:
        """The wire record: a tombstone if deleted, else the live checkpoint."""
        if self.is_tombstone:
            return protocol.TombstoneRecord(
                id=self.id,
                namespace=self.namespace,
                parent=self.parent,
                created_at=rfc3339(self.created_at),
                deleted_at=rfc3339(self.deleted_at or 0.0),
            )
        return protocol.CheckpointRecord(
            id=self.id,
            namespace=self.namespace,
            parent=self.parent,
            created_at=rfc3339(self.created_at),
            metadata=self.metadata,
            tags=self.tags,
            pinned=self.pinned,
            validity=self.validity.to_protocol(),
            files={n: protocol.FileInfo(f["size"], f["hash"]) for n, f in self.files.items()},
            size=self.size,
            tier=self.tier,
            durable=self.durable,
        )


_RECORD_FIELDS = (
    "id",
    "namespace",
    "parent",
    "created_at",
    "metadata",
    "tags",
    "files",
    "size",
    "pinned",
    "validity",
    "tier",
    "deleted_at",
    "promoted_at",
    "created_by",
    "durable",
)


@dataclass
class NamespaceRecord:
    name: str
    profile: dict[str, Any]  # ChunkingProfile fields
    created_at: float
    checkpoints: int = 0
    logical_bytes: int = 0
    emptied_at: float | None = None  # its last live checkpoint was deleted then: not listed

    def chunking(self) -> ChunkingProfile:
        return ChunkingProfile(**self.profile)

    def to_json(self) -> bytes:
        # By hand: every commit rewrites its namespace's record, asdict deep-copies.
        return json.dumps(self.__dict__, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes | memoryview) -> NamespaceRecord:
        return cls(**json.loads(bytes(raw)))


@dataclass
class UploadSession:
    id: str
    namespace: str
    parent: str | None
    inherit: bool
    metadata: dict[str, Any]
    tags: list[str]
    created_at: float
    expires_at: float
    committed: str | None = None  # checkpoint id once committed
    created_by: str | None = None  # token name that opened it (per-token limits, ownership)
    sent_bytes: int = 0  # bytes of new chunks it stored, pending until it ends
    prepared: str | None = None  # the cross-namespace commit holding it (vault/txn.py)
    prepared_at: float | None = None  # when it was prepared (the resolver's timeout)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes | memoryview) -> UploadSession:
        return cls(**json.loads(bytes(raw)))
