"""The local channel between the writing process and its workers: message kinds and framing.

Only this module knows the bytes on `ckpt-calls.sock` (node/calls.py gives them meaning).
Every message is a frame: a 13-byte head (payload length u32, call id u64, kind u8, big
endian) and a payload of one JSON object (u32 length, then UTF-8) followed by raw blobs
(u32 length each, then the bytes) up to the payload's end. Structured fields go in the
JSON, bytes (files, frames, records) in blobs, so a save's chunks are copied once and never
escaped or parsed. Nothing is ever unpickled: the channel used to carry pickles, and any
process that reached the socket could have the writing process run code of its choosing.

Decoding is strict: an unknown kind, a kind the receiving end does not take, a length past
`MAX_FRAME` or the payload, JSON that is not an object, are `ChannelError`; the reader
closes the connection then, since nothing after a bad frame can be trusted to be aligned.
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

HEAD = struct.Struct(">IQB")
_LENGTH = struct.Struct(">I")
MAX_FRAME = 1 << 30  # bytes of payload; a worker's request is bounded far below this
_JSON = json.JSONEncoder(separators=(",", ":")).encode  # one encoder: json.dumps makes one a call
_UNJSON = json.JSONDecoder().decode


class Kind(enum.IntEnum):
    """What a frame holds. A call is a question and its answer under one call id: ids
    are each end's own, so the kind says which way a frame goes."""

    SAVES = 1  # worker -> writer: prepared saves to commit in one writer batch
    SAVED = 2  # writer -> worker: each save's outcome, in order (record, or error)
    USES = 3  # worker -> writer: when it last saw each token
    NOTED = 4  # writer -> worker: the uses were taken
    FAILED = 5  # writer -> worker: the whole call failed (one error)
    METRICS_ASK = 6  # writer -> worker: its metrics, please (for /metrics)
    METRICS = 7  # worker -> writer: its metrics, Prometheus text


_KINDS = {kind.value: kind for kind in Kind}
TO_WRITER = frozenset({Kind.SAVES, Kind.USES, Kind.METRICS})
TO_WORKER = frozenset({Kind.SAVED, Kind.NOTED, Kind.FAILED, Kind.METRICS_ASK})


class ChannelError(ValueError):
    """A frame that is not one this channel's other end sends: the connection is closed."""


@dataclass(frozen=True)
class Message:
    kind: Kind
    call: int
    fields: dict[str, Any] = field(default_factory=dict)
    blobs: Sequence[bytes | memoryview] = ()


def encode(message: Message) -> bytes:
    """The frame of `message`, head included."""
    head = _JSON(message.fields).encode()
    pieces: list[bytes | memoryview] = [b"", _LENGTH.pack(len(head)), head]
    length = _LENGTH.size + len(head)
    for blob in message.blobs:
        pieces.append(_LENGTH.pack(len(blob)))
        pieces.append(blob)
        length += _LENGTH.size + len(blob)
    if length > MAX_FRAME:
        raise ChannelError(f"a frame of {length} bytes")
    pieces[0] = HEAD.pack(length, message.call, message.kind)
    return b"".join(pieces)


def decode(kind: int, call: int, payload: bytes, accepted: frozenset[Kind]) -> Message:
    """The message in `payload` (a frame's, its head already read)."""
    named = _KINDS.get(kind)
    if named is None or named not in accepted:
        raise ChannelError(f"a frame of kind {kind}, which this end does not take")
    view = memoryview(payload)
    head = _blob(view, 0)
    try:
        fields = _UNJSON(str(head, "utf-8"))  # from str: json.loads(bytes) sniffs first
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ChannelError(f"a frame whose fields are not JSON ({e})") from None
    if not isinstance(fields, dict):
        raise ChannelError("a frame whose fields are not a JSON object")
    at = _LENGTH.size + len(head)
    blobs = []
    while at < len(view):
        blob = _blob(view, at)
        blobs.append(blob)
        at += _LENGTH.size + len(blob)
    return Message(named, call, fields, blobs)


def _blob(view: memoryview, at: int) -> memoryview:
    if at + _LENGTH.size > len(view):
        raise ChannelError("a frame cut inside a length")
    (length,) = _LENGTH.unpack_from(view, at)
    start = at + _LENGTH.size
    if start + length > len(view):
        raise ChannelError(f"a part of {length} bytes past the frame's end")
    return view[start : start + length]


def take(buffer: bytearray, accepted: frozenset[Kind]) -> Iterator[Message]:
    """Each whole frame at the start of `buffer` (what a connection's protocol received,
    both ends buffer it themselves), taken out of it as it is yielded; ChannelError if
    a frame is not one `accepted` holds, or is longer than MAX_FRAME (told by its head,
    before its payload arrives)."""
    while len(buffer) >= HEAD.size:
        length, call, kind = _head(buffer)
        end = HEAD.size + length
        if len(buffer) < end:
            return
        with memoryview(buffer) as view:
            payload = bytes(view[HEAD.size : end])
        del buffer[:end]
        yield decode(kind, call, payload, accepted)


def _head(raw: bytes | bytearray) -> tuple[int, int, int]:
    length, call, kind = HEAD.unpack_from(raw)
    if length > MAX_FRAME:
        raise ChannelError(f"a frame of {length} bytes")
    return length, call, kind


def want(fields: Mapping[str, Any], name: str, *types: type) -> Any:
    """`fields[name]`, whose type must be exactly one of `types` (None: `type(None)`; JSON
    gives no subclasses, and a bool is not taken for an int)."""
    try:
        value = fields[name]
    except KeyError:
        raise ChannelError(f"a frame without its {name!r}") from None
    if type(value) not in types:
        raise ChannelError(f"a frame whose {name!r} is a {type(value).__name__}")
    return value
