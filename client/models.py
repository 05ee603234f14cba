"""What the client hands back: plain dataclasses built from the wire records.

`Checkpoint` holds the protocol's record it was parsed from (`record`: a
`protocol.CheckpointRecord`, or a `TombstoneRecord` for a deleted one), so the client reads
and writes back exactly the fields the server wrote. Its `validity` and `files` are the
protocol's records (`ckpt.files[name].size`, `ckpt.validity.state`): until issue 42 they
were the JSON dicts, read by string key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from checkpoint_vault.protocol import (
    FileInfo,
    JSONObject,
    LineageEntry,
    TombstoneRecord,
    Validity,
    lineage_entry_from_wire,
)


@dataclass(frozen=True)
class Checkpoint:
    id: str
    namespace: str
    parent: str | None
    created_at: str
    metadata: JSONObject = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    pinned: bool = False
    validity: Validity = field(default_factory=Validity)
    files: dict[str, FileInfo] = field(default_factory=dict)
    size: int = 0
    tier: str = "hot"
    deleted: bool = False
    # False: a commit of parts whose bytes are still only on the parts' nodes (read
    # through the owner all the same); `get(..., durable=True)` skips such checkpoints
    durable: bool = True
    # What the server sent, typed (validity and files as records): `to_wire` is its JSON.
    record: LineageEntry | None = field(default=None, repr=False, compare=False)

    @property
    def valid(self) -> bool | None:
        """True if marked valid, False if invalid, None while unverified."""
        state = self.validity.state
        return None if state == "unverified" else state == "valid"

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> Checkpoint:
        """A record or tombstone as the server answers it; ValueError if malformed."""
        return cls.from_protocol(lineage_entry_from_wire(d))

    @classmethod
    def from_protocol(cls, r: LineageEntry) -> Checkpoint:
        if isinstance(r, TombstoneRecord):
            return cls(r.id, r.namespace, r.parent, r.created_at, deleted=True, record=r)
        return cls(
            id=r.id,
            namespace=r.namespace,
            parent=r.parent,
            created_at=r.created_at,
            metadata=r.metadata,
            tags=list(r.tags),
            pinned=r.pinned,
            validity=r.validity,
            files=r.files,
            size=r.size,
            tier=r.tier,
            durable=r.durable,
            record=r,
        )

    def to_wire(self) -> dict[str, Any]:
        """The record's JSON as the server sent it."""
        if self.record is None:
            raise ValueError("a Checkpoint made by hand has no wire form: parse one")
        return self.record.to_wire()


@dataclass
class Transfer:
    """Payload bytes over the wire since the client was made (request and response bodies)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    requests: int = 0
    retries: int = 0
