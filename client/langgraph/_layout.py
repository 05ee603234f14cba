"""Where LangGraph's checkpoints live in the vault: namespaces, tags and record metadata.

One vault namespace per thread, `<prefix>/<thread segment>`, holds every record of that
thread, for every `checkpoint_ns` (subgraphs included). Records are of two kinds:

- a *checkpoint record* per `put`: a file per channel value (`c/<channel>`), and file
  `checkpoint` with the checkpoint document and the pending writes that arrived before the
  put (see `_saver.py`). The record's parent is the parent checkpoint's record and it
  inherits the parent's files, so a put sends only the channels that changed;
- a *writes record* per `put_writes`: file `writes`.

LangGraph's own ids and names are kept in each record's metadata under `LANGGRAPH_KEY`
(exact strings, so nothing depends on the encodings below being reversible), and in tags
the server can filter on: `lg:ns:<checkpoint_ns>` (both kinds, for "latest in this
checkpoint_ns") and `lg:id:<checkpoint_id>` (both kinds, for "this checkpoint and its
writes"). Encodings are injective: distinct strings never share a segment or a tag.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import blake3

from ..models import Checkpoint as Record

CHECKPOINT_FILE = "checkpoint"
WRITES_FILE = "writes"
KIND_CHECKPOINT = "checkpoint"
KIND_WRITES = "writes"
LANGGRAPH_KEY = "langgraph"  # metadata key holding the kind; the other keys sit beside it
CHUNKING = "small"  # ~2 KiB chunks: a re-serialized message history dedups to its new part

_PLAIN_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._:-]{0,199}")
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
# Thread ids used as they are: no ':' so they can never look like a hashed segment.
_PLAIN_THREAD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_SLUG_DROP = re.compile(r"[^A-Za-z0-9._-]+")
MAX_PREFIX_SEGMENTS = 7  # the vault allows 8 segments; the thread takes the last
_TAG_ROOM = 120  # the vault's tags hold 128 characters; longer values are hashed


def _digest(value: str) -> str:
    return blake3.blake3(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def thread_segment(thread_id: str) -> str:
    """The namespace segment of a thread: itself when it is a plain name, else a readable
    slug and a 128-bit hash joined by ':' (plain names never contain ':')."""
    if _PLAIN_THREAD.fullmatch(thread_id):
        return thread_id
    slug = _SLUG_DROP.sub("-", thread_id)[:40].lstrip("-._").rstrip("-._") or "thread"
    return f"{slug}:{_digest(thread_id)}"


def channel_file(channel: str) -> str:
    """The file holding a channel's value: `c/<channel>`, or `c/#<hash>` for a name that
    is not a plain file name (plain names never contain '#')."""
    if _PLAIN_FILE.fullmatch(channel):
        return f"c/{channel}"
    return f"c/#{_digest(channel)}"


def _tag(kind: str, value: str) -> str:
    if len(value) <= _TAG_ROOM - len(kind):
        return f"lg:{kind}:{value}"
    return f"lg:{kind}#{_digest(value)}"  # '#' never follows the kind in a plain tag


def ns_tag(checkpoint_ns: str) -> str:
    return _tag("ns", checkpoint_ns)


def id_tag(checkpoint_id: str) -> str:
    return _tag("id", checkpoint_id)


@dataclass(frozen=True)
class Layout:
    """Namespace names under one prefix (default `langgraph`)."""

    prefix: str = "langgraph"

    def __post_init__(self) -> None:
        segments = self.prefix.split("/")
        if len(segments) > MAX_PREFIX_SEGMENTS or not all(_SEGMENT.fullmatch(s) for s in segments):
            raise ValueError(
                f"prefix {self.prefix!r}: up to {MAX_PREFIX_SEGMENTS} '/'-separated segments "
                "of [A-Za-z0-9][A-Za-z0-9._:-]{0,127}"
            )

    def namespace(self, thread_id: str) -> str:
        return f"{self.prefix}/{thread_segment(thread_id)}"

    def owns(self, namespace: str) -> bool:
        """A thread namespace under this prefix (one segment below it)."""
        head, _, tail = namespace.rpartition("/")
        return head == self.prefix and bool(tail)


@dataclass(frozen=True)
class Ref:
    """What a vault record is to LangGraph, read back from its metadata."""

    kind: str
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str

    @classmethod
    def of(cls, record: Record) -> Ref | None:
        """None for records this integration did not write."""
        return cls.of_metadata(record.metadata)

    @classmethod
    def of_wire(cls, record: Mapping[str, Any]) -> Ref | None:
        """`of` a record as the server's JSON (a tombstone has no metadata: None)."""
        md = record.get("metadata")
        return cls.of_metadata(md) if isinstance(md, dict) else None

    @classmethod
    def of_metadata(cls, md: Mapping[str, Any]) -> Ref | None:
        kind = md.get(LANGGRAPH_KEY)
        if kind not in (KIND_CHECKPOINT, KIND_WRITES):
            return None
        return cls(kind, str(md["thread_id"]), str(md["checkpoint_ns"]), str(md["checkpoint_id"]))


def record_metadata(
    kind: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str
) -> dict[str, Any]:
    return {
        LANGGRAPH_KEY: kind,
        "thread_id": thread_id,
        "checkpoint_ns": checkpoint_ns,
        "checkpoint_id": checkpoint_id,
    }


def record_tags(kind: str, checkpoint_ns: str, checkpoint_id: str) -> list[str]:
    return [f"lg:{kind}", ns_tag(checkpoint_ns), id_tag(checkpoint_id)]
