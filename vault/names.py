"""Validation of every name that reaches the engine from outside.

Names end up as LMDB keys and, on download, as paths on a user's disk, so they are checked
once, at the edge of the engine, against a strict grammar.
"""

from __future__ import annotations

import re

from checkpoint_vault.protocol import NOT_IN_NAMES

from .errors import InvalidName

_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}"
MAX_NAMESPACE_SEGMENTS = 8
# One match for the whole name (a segment holds no '/'): per segment, then per character,
# these checks ran two dozen Python calls on every request that names a file.
_NAMESPACE = re.compile(f"{_SEGMENT}(?:/{_SEGMENT}){{0,{MAX_NAMESPACE_SEGMENTS - 1}}}")
_CONTROL = re.compile("[\x00-\x1f\x7f]")
_CHUNK_ID = re.compile(r"[0-9a-f]{64}")
MAX_FILE_NAME_BYTES = 1024
# The namespace parts of a commit across hosts are kept in (vault/parts.py): a name
# `check_namespace` refuses, so no route reaches it; listings and retention leave it out.
PARTS = "_parts"


def check_namespace(ns: str) -> str:
    if not _NAMESPACE.fullmatch(ns):
        raise InvalidName(
            f"invalid namespace {ns[:200]!r}: up to {MAX_NAMESPACE_SEGMENTS} '/'-separated "
            "segments of [A-Za-z0-9][A-Za-z0-9._:-]{0,127}"
        )
    return ns


def check_file_name(name: str, *, stored: bool = False) -> str:
    """`name` if it may name a file. `stored`: a name an earlier version accepted (a save
    journal's record applied again), held only to what was always refused, so that what
    was acknowledged is still applied."""
    encoded = name.encode("utf-8", "surrogatepass")
    if not name or len(encoded) > MAX_FILE_NAME_BYTES:
        raise InvalidName(f"file name must be 1 to {MAX_FILE_NAME_BYTES} bytes")
    if name.startswith("/"):
        raise InvalidName(f"file name {name[:200]!r} must be relative (no leading '/')")
    if _CONTROL.search(name):
        raise InvalidName("file name must not contain NUL or control characters")
    if not stored and (bad := NOT_IN_NAMES.search(name)) is not None:  # protocol/_text.py
        raise InvalidName(
            f"file name must not hold control, format (bidi, zero-width) or line-separator "
            f"characters; it holds U+{ord(bad.group()):04X}"
        )
    if any(seg in ("", ".", "..") for seg in name.split("/")):
        raise InvalidName(f"file name {name[:200]!r} has an empty, '.' or '..' segment")
    return name


def check_chunk_id(cid: str) -> bytes:
    """Return the 32 raw bytes of a chunk id given as 64 lowercase hex characters."""
    if not isinstance(cid, str) or not _CHUNK_ID.fullmatch(cid):
        raise InvalidName(f"chunk id must be 64 lowercase hex characters, got {str(cid)[:80]!r}")
    return bytes.fromhex(cid)
