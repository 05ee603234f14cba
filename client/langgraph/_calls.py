"""What one saver call carries: where a config points, what a put or put_writes sends, what
a read found; and the pure helpers the saver's methods share."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig

from ..models import Checkpoint as Record
from ._codec import StoredWrite, Typed
from ._layout import Ref
from ._memo import Key


@dataclass(frozen=True)
class Where:
    """A config, decoded: the thread's namespace and which checkpoint it names."""

    namespace: str
    thread_id: str
    checkpoint_ns: str | None  # None: every checkpoint_ns (list only)
    checkpoint_id: str | None


@dataclass
class Found:
    """A checkpoint record with its files' bytes and its writes records' files."""

    record: Record
    files: dict[str, bytes]
    writes: list[tuple[Record, bytes]]


@dataclass(frozen=True)
class Value:
    """One serialized channel value, as the file it goes to (not hashed: the vault answers
    each file's hash, and a value is compared with its parent's by size first)."""

    file: str
    data: bytes


@dataclass(frozen=True)
class Put:
    """A put, serialized in the caller; the saver's loop decides what of it to send."""

    key: Key
    parent: Key | None
    values: list[Value]
    document: Typed
    metadata: dict[str, Any]
    tags: list[str]
    # Channels whose version did not change (not in new_versions): their values are the
    # parent checkpoint's, so they are inherited unserialized when the parent's record
    # holds them (as PostgresSaver stores blobs only for new versions).
    unchanged: dict[str, Any]


@dataclass(frozen=True)
class Writes:
    """A put_writes, serialized in the caller."""

    key: Key
    writes: list[StoredWrite]
    metadata: dict[str, Any]
    tags: list[str]


async def next_found(scan: AsyncIterator[Found]) -> Found | None:
    try:
        return await anext(scan)
    except StopAsyncIteration:
        return None


async def close(scan: AsyncGenerator[Found, None]) -> None:
    await scan.aclose()


def wanted(
    rec: Record,
    ref: Ref,
    where: Where | None,
    before_id: str | None,
    filter: dict[str, Any] | None,
) -> bool:
    if where is not None:
        if where.checkpoint_ns is not None and ref.checkpoint_ns != where.checkpoint_ns:
            return False
        if where.checkpoint_id and ref.checkpoint_id != where.checkpoint_id:
            return False
    if before_id and ref.checkpoint_id >= before_id:
        return False
    metadata = rec.metadata.get("metadata") or {}
    return all(metadata.get(k) == v for k, v in (filter or {}).items())


def config_of(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
        }
    }
