"""The bytes of a `checkpoint` or `writes` file, and how pending writes combine.

Channel values are files of their own (`_layout.channel_file`), holding exactly what
`serde.dumps_typed` made, so an unchanged value is byte-identical from step to step and a
grown message history shares all but its last chunks with the previous one. What is left
per checkpoint, its document (versions, timestamps) and the writes folded into it, goes in
one small file:

    value bytes ... | header JSON | u32 LE header length | b"LGV1"

header: {"writes": [[task_id, task_path, channel, idx, type, size], ...],
"checkpoint": [type, size] | null}; pieces appear in that order. A `writes` record's file
has the same shape with no document.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from langgraph.checkpoint.base import writes_sort_key

from .. import fastjson

MAGIC = b"LGV1"
_TRAILER = struct.Struct("<I4s")

Typed = tuple[str, bytes]  # what SerializerProtocol.dumps_typed returns


@dataclass(frozen=True)
class StoredWrite:
    task_id: str
    task_path: str
    channel: str
    idx: int  # position in its put_writes call, or WRITES_IDX_MAP's negative slot
    value: Typed


@dataclass
class Contents:
    writes: list[StoredWrite] = field(default_factory=list)
    checkpoint: Typed | None = None


def encode(contents: Contents) -> bytes:
    pieces = [w.value[1] for w in contents.writes]
    header: dict[str, Any] = {
        "writes": [
            [w.task_id, w.task_path, w.channel, w.idx, w.value[0], len(w.value[1])]
            for w in contents.writes
        ],
        "checkpoint": None,
    }
    if contents.checkpoint is not None:
        kind, data = contents.checkpoint
        header["checkpoint"] = [kind, len(data)]
        pieces.append(data)
    head = fastjson.dumps_floatless(header)  # names, types, sizes
    return b"".join([*pieces, head, _TRAILER.pack(len(head), MAGIC)])


def decode(data: bytes) -> Contents:
    """Inverse of `encode`; ValueError when the bytes are not such a file."""
    if len(data) < _TRAILER.size:
        raise ValueError("file shorter than its trailer")
    head_len, magic = _TRAILER.unpack_from(data, len(data) - _TRAILER.size)
    if magic != MAGIC:
        raise ValueError("not a LangGraph checkpoint file (bad magic)")
    head_end = len(data) - _TRAILER.size
    header = fastjson.loads(data[head_end - head_len : head_end])
    view = memoryview(data)
    pos = 0

    def take(size: int) -> bytes:
        nonlocal pos
        if size < 0 or pos + size > head_end - head_len:
            raise ValueError("a piece runs past the values")
        pos += size
        return bytes(view[pos - size : pos])

    out = Contents()
    for task_id, task_path, channel, idx, kind, size in header["writes"]:
        out.writes.append(StoredWrite(task_id, task_path, channel, idx, (kind, take(size))))
    if header["checkpoint"] is not None:
        kind, size = header["checkpoint"]
        out.checkpoint = (kind, take(size))
    return out


def merge_writes(batches: Iterable[Iterable[StoredWrite]]) -> list[StoredWrite]:
    """Pending writes as LangGraph expects them, from batches in commit order: a regular
    write (idx >= 0) is kept the first time its (task, idx) is seen, a special one (error,
    interrupt, resume...) the last time, as the in-memory and SQLite savers do. The same
    write stored twice (folded into its checkpoint and also on its own) counts once.
    Sorted by `writes_sort_key`, the order live execution applies them in."""
    kept: dict[tuple[str, int], StoredWrite] = {}
    for batch in batches:
        for w in batch:
            key = (w.task_id, w.idx)
            if w.idx >= 0 and key in kept:
                continue
            kept[key] = w
    return sorted(kept.values(), key=lambda w: writes_sort_key(w.task_path, w.task_id, w.idx))
