"""The records of a checkpoint written on many hosts and committed once (vault/parts.py):
what a node answers for a part it holds, and the manifest an owner fetches to adopt it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._wire import Record

_TIME: dict[str, Any] = {"schema": {"format": "date-time"}}


@dataclass(frozen=True)
class PartSaved(Record):
    """A part as its node holds it: what a writer names in a commit (`node`, `id`)."""

    node: str  # the node's [cluster] url; "": the node that answered (no cluster)
    id: str
    namespace: str  # the namespace it is for
    size: int
    files: list[str]
    expires_at: str = field(metadata=_TIME)
    shipped: bool = False  # every chunk in the cluster's shared tier


@dataclass(frozen=True)
class PartFile(Record):
    """A file of a part: size, BLAKE3 (hex) and its chunks in order, with their sizes."""

    size: int
    hash: str
    chunks: list[str]
    sizes: list[int]


@dataclass(frozen=True)
class PartRecord(Record):
    """A part's manifest, for the owner that adopts it."""

    id: str
    namespace: str
    created_by: str | None
    created_at: str = field(metadata=_TIME)
    expires_at: str = field(metadata=_TIME)
    shipped: bool = False
    files: dict[str, PartFile] = field(default_factory=dict)
