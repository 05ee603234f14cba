"""The binary request bodies: chunk batches and one-request checkpoint bundles.

Both sides encode and decode them here (the client sends, api/ decodes), so the framing is
written once. Malformed bodies raise `ValueError`, which api/ answers as `invalid_request`.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# -- binary bodies --------------------------------------------------------------------------
# POST /v1/uploads/{id}/chunks: the body is a run of records, each the chunk's raw 32-byte
# id, its length as u32 little endian, then its bytes. One request carries many chunks. A
# record whose length is CHUNK_REFERENCE has no bytes: it names a chunk the vault already
# has, so a batch can say what lies in a stretch of a file without sending it again.
CHUNK_RECORD_HEAD = struct.Struct("<32sI")
CHUNK_REFERENCE = 0xFFFF_FFFF
CHUNK_BATCH_TYPE = "application/vnd.ckpt.chunks"
# POST /v1/namespaces/{ns}/checkpoints: magic, u32 header length, a JSON header
# {"files": [[name, size], ...], "parent", "inherit", "metadata", "tags", "chunking", "key"},
# then every file's bytes in header order. The one-request save for small checkpoints.
BUNDLE_MAGIC = b"CVB1"
BUNDLE_HEAD = struct.Struct("<4sI")
BUNDLE_TYPE = "application/vnd.ckpt.bundle"
# POST /v1/saves: several one-request saves in one request, each a bundle as above whose
# header also names its "namespace", one after the other. A client with many agents
# saving at once sends what queued while its previous request was under way in one
# (client/coalesce.py): one HTTP exchange, one hop to the writer, one commit for them all.
SAVES_TYPE = "application/vnd.ckpt.saves"
MAX_SAVES = 64  # bundles in one such body
# `PUT files/{name}` over the local socket: a one-byte body carrying the open file's
# descriptor (SCM_RIGHTS); the server reads the file itself.
DESCRIPTOR_TYPE = "application/vnd.ckpt.descriptor"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"  # the interim answer a descriptor waits for


def encode_chunk_batch(
    chunks: Sequence[tuple[bytes, bytes | memoryview | None]],
) -> list[bytes | memoryview]:
    """Body parts (to join or stream) for a chunk batch of (raw id, data); data None makes
    a reference to a chunk the vault has."""
    parts: list[bytes | memoryview] = []
    for cid, data in chunks:
        if data is None:
            parts.append(CHUNK_RECORD_HEAD.pack(cid, CHUNK_REFERENCE))
        else:
            parts.append(CHUNK_RECORD_HEAD.pack(cid, len(data)))
            parts.append(data)
    return parts


def decode_chunk_batch(
    body: bytes | bytearray | memoryview, room: int = 0
) -> list[tuple[bytes, memoryview | None]]:
    """Inverse of encode_chunk_batch; ValueError if the body is malformed. The chunks are
    views into `body`: copying a 64 MiB batch out piece by piece cost the server more than
    verifying it. With `room` (at most the record head's 36 bytes), each view starts that
    many bytes before its chunk, inside the record head, which is spent once decoded: a
    receiver holding the body writable can put a header of its own there. A reference
    decodes as (id, None)."""
    if not 0 <= room <= CHUNK_RECORD_HEAD.size:
        raise ValueError(f"room must be 0 to {CHUNK_RECORD_HEAD.size} bytes")
    view = memoryview(body)
    out: list[tuple[bytes, memoryview | None]] = []
    pos = 0
    while pos < len(view):
        if pos + CHUNK_RECORD_HEAD.size > len(view):
            raise ValueError(f"truncated chunk record header at byte {pos}")
        cid, n = CHUNK_RECORD_HEAD.unpack_from(view, pos)
        pos += CHUNK_RECORD_HEAD.size
        if n == CHUNK_REFERENCE:
            out.append((bytes(cid), None))
            continue
        if pos + n > len(view):
            raise ValueError(f"chunk record at byte {pos} claims {n} bytes past the end")
        out.append((bytes(cid), view[pos - room : pos + n]))
        pos += n
    return out


def encode_bundle(
    header: dict[str, Any],
    files: list[tuple[str, bytes]],
    dumps: Callable[[Any], bytes] = lambda v: json.dumps(v).encode(),
) -> bytes:
    return b"".join(bundle_parts(header, files, dumps))


def bundle_parts(
    header: dict[str, Any],
    files: list[tuple[str, bytes]],
    dumps: Callable[[Any], bytes] = lambda v: json.dumps(v).encode(),
) -> list[bytes]:
    """A bundle as parts to send one after the other, the files' bytes not copied into one
    buffer. `dumps` writes the header's JSON: the client passes a faster writer of the same
    JSON (client/fastjson.py), as `decode_bundle` takes the server's parser."""
    head = dumps({**header, "files": [[n, len(d)] for n, d in files]})
    return [BUNDLE_HEAD.pack(BUNDLE_MAGIC, len(head)), head, *(d for _, d in files)]


def decode_bundle(
    body: bytes, loads: Callable[[bytes], Any] = json.loads
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(header, {name: bytes}); ValueError if the body is malformed. `loads` parses the
    header: the server passes its one JSON parser with the limits (depth, size, numbers),
    since a header is as much untrusted input as a JSON body."""
    header, files, end = _bundle_at(body, 0, loads)
    if end != len(body):
        raise ValueError(f"bundle body is {len(body)} bytes, its header describes {end}")
    return header, files


def decode_saves(
    body: bytes, loads: Callable[[bytes], Any] = json.loads
) -> list[tuple[Mapping[str, Any], dict[str, bytes]]]:
    """The bundles of a `SAVES_TYPE` body, each (header, files) as `decode_bundle`'s;
    ValueError if any is malformed or there are none or more than `MAX_SAVES`."""
    out: list[tuple[Mapping[str, Any], dict[str, bytes]]] = []
    pos = 0
    while pos < len(body):
        if len(out) == MAX_SAVES:
            raise ValueError(f"more than {MAX_SAVES} saves in one body")
        header, files, pos = _bundle_at(body, pos, loads)
        out.append((header, files))
    if not out:
        raise ValueError("no saves in the body")
    return out


def _bundle_at(
    body: bytes, start: int, loads: Callable[[bytes], Any]
) -> tuple[dict[str, Any], dict[str, bytes], int]:
    """The bundle starting at byte `start` of `body`, and where it ends."""
    if len(body) - start < BUNDLE_HEAD.size:
        raise ValueError("bundle shorter than its header")
    magic, head_len = BUNDLE_HEAD.unpack_from(body, start)
    if magic != BUNDLE_MAGIC:
        raise ValueError("not a checkpoint bundle (bad magic)")
    pos = start + BUNDLE_HEAD.size + head_len
    if pos > len(body):
        raise ValueError("bundle header runs past the end of the body")
    header = loads(body[start + BUNDLE_HEAD.size : pos])
    if not isinstance(header, dict) or not isinstance(header.get("files"), list):
        raise ValueError("bundle header must be an object with a files list")
    files: dict[str, bytes] = {}
    for item in header["files"]:
        if not isinstance(item, list) or len(item) != 2:
            raise ValueError("bundle files entries must be [name, size]")
        name, size = item
        if not isinstance(name, str) or not isinstance(size, int) or size < 0:
            raise ValueError("bundle files entries must be [name, size]")
        if name in files:
            raise ValueError(f"file {name!r} appears twice in the bundle")
        if pos + size > len(body):
            raise ValueError(f"file {name!r} runs past the end of the body")
        files[name] = body[pos : pos + size]
        pos += size
    return header, files, pos
