"""Request JSON into the engine's typed arguments.

Handlers hand `Vault` typed values (`list[str]` tags, `CommitFile`s, ...), never raw JSON;
this module does the narrowing. A value of the wrong JSON type is a 400 `invalid_request`
(or `invalid_name` for chunk ids and file names) with the same message the engine's own
checks give, so answers do not depend on which layer noticed. Value checks (lengths,
ranges, hex) stay in vault, which also serves direct callers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from checkpoint_vault.protocol import JSON, VALIDITY_STATES, CommitFile
from checkpoint_vault.vault import InvalidRequest
from checkpoint_vault.vault.names import check_chunk_id, check_file_name
from checkpoint_vault.vault.uploads import MAX_MISSING_QUERY, check_metadata, check_tags

Chunking = str | Mapping[str, JSON]


def parent(value: JSON) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidRequest("parent must be a checkpoint id, 'latest' or null")
    return value


def metadata(value: JSON) -> dict[str, JSON] | None:
    return None if value is None else check_metadata(value)


def tags(value: JSON) -> list[str] | None:
    return None if value is None else check_tags(value)


def chunking(value: JSON) -> Chunking | None:
    if value is not None and not isinstance(value, (str, dict)):
        raise InvalidRequest("chunking must be a profile name or {min_size, avg_size, max_size}")
    return value


def chunk_ids(value: JSON) -> list[str]:
    if not isinstance(value, list) or len(value) > MAX_MISSING_QUERY:
        raise InvalidRequest(f"chunks must be a list of at most {MAX_MISSING_QUERY} ids")
    for cid in value:
        check_chunk_id(cid)
    return value


def bulk_delete(body: Mapping[str, JSON]) -> list[str] | None:
    """A bulk delete's target: `{"ids": [...]}`, or `{"all": true}` for every checkpoint
    of the namespace (None). Deleting everything is never what an empty or garbled body
    means."""
    if body.get("all") is True and "ids" not in body:
        return None
    if "ids" not in body or "all" in body:
        raise InvalidRequest('give either "ids": [checkpoint ids] or "all": true')
    return checkpoint_ids(body["ids"])


def checkpoint_ids(value: JSON) -> list[str]:
    """A bulk delete's `ids`."""
    if (
        not isinstance(value, list)
        or len(value) > MAX_MISSING_QUERY
        or not all(isinstance(v, str) for v in value)
    ):
        raise InvalidRequest(f"ids must be a list of at most {MAX_MISSING_QUERY} checkpoint ids")
    return [str(v) for v in value]


def commit_files(value: JSON) -> dict[str, CommitFile] | None:
    """A commit body's `files`: name -> {size, hash, chunks}."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequest("files must be an object of name -> {size, hash, chunks}")
    return {name: _commit_file(name, spec) for name, spec in value.items()}


def _commit_file(name: str, spec: Any) -> CommitFile:
    check_file_name(name)
    if not isinstance(spec, dict) or not isinstance(spec.get("chunks"), list):
        raise InvalidRequest(f"file {name!r} needs a size and a chunks list")
    size = spec.get("size")
    if isinstance(size, float) and size.is_integer():  # JSON has one number type: 7.0 is 7
        size = int(size)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise InvalidRequest(f"file {name!r}: size must be a non-negative integer")
    digest = spec.get("hash")  # optional: the server computes it when it is left out
    if digest is not None:
        check_chunk_id(digest)  # same 64-hex form as chunk ids
    for cid in spec["chunks"]:
        check_chunk_id(cid)
    return CommitFile(size, digest, list(spec["chunks"]))


def validity(value: JSON) -> Mapping[str, JSON] | None:
    if value is not None and not isinstance(value, dict):
        raise InvalidRequest(f"validity needs a state, one of {', '.join(VALIDITY_STATES)}")
    return value


def pinned(value: JSON) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise InvalidRequest("pinned must be true or false")
    return value


def namespace(value: JSON) -> str:
    if not isinstance(value, str):
        raise InvalidRequest("fork needs a target namespace")
    return value


def idempotency_key(value: JSON) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidRequest("idempotency key must be 16-64 characters of [A-Za-z0-9_-]")
    return value
