"""What the client hands back: plain dataclasses built from the wire records."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Checkpoint:
    id: str
    namespace: str
    parent: str | None
    created_at: str
    metadata: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    pinned: bool = False
    validity: dict[str, Any] = field(default_factory=dict)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    size: int = 0
    tier: str = "hot"
    deleted: bool = False

    @property
    def valid(self) -> bool | None:
        """True if marked valid, False if invalid, None while unverified."""
        state = self.validity.get("state")
        return None if state in (None, "unverified") else state == "valid"

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Checkpoint:
        return cls(
            id=d["id"],
            namespace=d["namespace"],
            parent=d.get("parent"),
            created_at=d.get("created_at", ""),
            metadata=d.get("metadata") or {},
            tags=d.get("tags") or [],
            pinned=bool(d.get("pinned", False)),
            validity=d.get("validity") or {},
            files=d.get("files") or {},
            size=int(d.get("size", 0)),
            tier=d.get("tier", "hot"),
            deleted=bool(d.get("deleted", False)),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "namespace": self.namespace,
            "parent": self.parent,
            "created_at": self.created_at,
            "metadata": self.metadata,
            "tags": self.tags,
            "pinned": self.pinned,
            "validity": self.validity,
            "files": self.files,
            "size": self.size,
            "tier": self.tier,
            **({"deleted": True} if self.deleted else {}),
        }


@dataclass
class Transfer:
    """Payload bytes over the wire since the client was made (request and response bodies)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    requests: int = 0
    retries: int = 0
