"""The wire contract shared by api/ and client/: error codes and JSON field shapes.

Standard library only, so the client can import it without any server dependency.
"""

from __future__ import annotations

from typing import Any, TypedDict

API_PREFIX = "/v1"
DEFAULT_URL = "http://127.0.0.1:8470"
DEFAULT_PORT = 8470
DEFAULT_DATA_DIR = "ckpt-data"
ADMIN_TOKEN_FILE = "admin.token"

# Every error body is {"error": {"code": <one of these>, "message": str, ...}}.
ERROR_CODES = {
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "invalid_name": 400,
    "invalid_request": 400,
    "invalid_range": 416,
    "hash_mismatch": 400,
    "too_large": 413,
    "missing_chunks": 409,
    "conflict": 409,
    "upload_expired": 410,
    "unavailable": 503,
    "corrupt_chunk": 500,
    "internal": 500,
}


class Chunking(TypedDict):
    algorithm: str
    variant: str
    normalized_chunking: int
    seed: int
    profile: str
    min_size: int
    avg_size: int
    max_size: int


class ValidityWire(TypedDict):
    state: str
    reason: str | None
    source: str | None
    at: str | None


class CheckpointWire(TypedDict):
    id: str
    namespace: str
    parent: str | None
    created_at: str
    metadata: dict[str, Any]
    tags: list[str]
    pinned: bool
    validity: ValidityWire
    files: dict[str, dict[str, Any]]
    size: int
    tier: str
