"""Buckets and keys: which namespace a bucket is, which keys the vault can hold.

A bucket is one namespace of the same name (one series of checkpoints: give each job its
own bucket). S3's bucket-name rules (3-63 lowercase letters, digits, dots and hyphens,
starting and ending with a letter or digit) make every bucket name a valid namespace; a
namespace with `/` segments or capitals is not reachable as a bucket. A key must be a
valid file name of the vault (vault/names.py: `/`-separated segments, no `.`, `..` or
empty segment, no control characters, at most 1024 bytes) outside the endpoint's own
reserved prefix (api/s3/tree.py).
"""

from __future__ import annotations

import re

from checkpoint_vault.vault import VaultError
from checkpoint_vault.vault.names import check_file_name

from .errors import S3Error, invalid_argument
from .tree import RESERVED

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
MAX_KEY = 1024 - len(RESERVED) * 2 - len("deleted/dirs/")  # a deleted marker's record fits


def namespace(bucket: str) -> str:
    """The namespace a bucket is; InvalidBucketName for a name S3 would refuse."""
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise S3Error("InvalidBucketName", 400, "The specified bucket is not valid.", bucket)
    return bucket


def check_key(key: str) -> str:
    if key.startswith(RESERVED) or key == RESERVED.rstrip("/"):
        raise invalid_argument(f"keys under {RESERVED} are reserved by the vault")
    if len(key.encode()) > MAX_KEY:
        raise S3Error("KeyTooLongError", 400, f"keys may be at most {MAX_KEY} bytes here")
    try:
        check_file_name(key[:-1] if key.endswith("/") else key)  # `a/b/`: a directory marker
    except VaultError as e:
        raise invalid_argument(f"this key cannot be stored in the vault: {e}") from None
    return key
