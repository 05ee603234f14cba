"""A tier in an object store through obstore: `s3://bucket/prefix` (any S3-compatible
server: SeaweedFS, MinIO, Ceph, AWS), `gs://`, `az://`.

Provider errors are translated here, in one table: not found, already exists (conditional
create), and everything that means "the store did not answer" (connection refused, timeouts,
5xx after obstore's own retries) becomes `TierUnavailable`, so callers can tell "data is
gone" from "try later". Messages carry the tier name and key, never the provider's text
(which names buckets and endpoints).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    GenericError,
    NotFoundError,
    PermissionDeniedError,
    UnauthenticatedError,
)

from checkpoint_vault.vault.errors import ObjectExists, ObjectNotFound, TierError, TierUnavailable
from checkpoint_vault.vault.tier import check_key

log = logging.getLogger("ckpt.tiering")

# obstore retries 5xx and connection errors itself; keep it short so an outage surfaces as
# TierUnavailable in seconds, not the default three minutes.
RETRY = {
    "max_retries": 3,
    "retry_timeout": timedelta(seconds=5),
    "backoff": {"init_backoff": timedelta(milliseconds=50), "max_backoff": timedelta(seconds=1)},
}
CLIENT = {"connect_timeout": timedelta(seconds=2), "timeout": timedelta(seconds=60)}


class ObjectStoreTier:
    def __init__(self, store: Any, name: str = "object") -> None:
        self.name = name
        self._store = store

    def put(self, key: str, data: bytes | memoryview, *, if_absent: bool = False) -> None:
        check_key(key)
        try:
            obstore.put(
                self._store,
                key,
                bytes(data) if isinstance(data, memoryview) else data,
                mode="create" if if_absent else "overwrite",
            )
        except Exception as e:
            raise self._translate(e, key) from e

    def get(self, key: str) -> bytes:
        check_key(key)
        try:
            return bytes(obstore.get(self._store, key).bytes())
        except Exception as e:
            raise self._translate(e, key) from e

    def get_range(self, key: str, start: int, length: int) -> bytes:
        check_key(key)
        if length <= 0:
            return b""
        try:
            return bytes(obstore.get_range(self._store, key, start=start, length=length))
        except Exception as e:
            if _range_refused(e):  # past the end: clamp to the object's size, once
                return self._clamped_range(key, start, length)
            raise self._translate(e, key) from e

    def _clamped_range(self, key: str, start: int, length: int) -> bytes:
        try:
            size = obstore.head(self._store, key)["size"]
            if start >= size:
                return b""
            end = min(start + length, size)
            return bytes(obstore.get_range(self._store, key, start=start, end=end))
        except Exception as e:
            raise self._translate(e, key) from e

    def head(self, key: str) -> int | None:
        check_key(key)
        try:
            return int(obstore.head(self._store, key)["size"])
        except (FileNotFoundError, NotFoundError):
            return None
        except Exception as e:
            raise self._translate(e, key) from e

    def modified(self, key: str) -> float | None:
        check_key(key)
        try:
            return float(obstore.head(self._store, key)["last_modified"].timestamp())
        except (FileNotFoundError, NotFoundError):
            return None
        except Exception as e:
            raise self._translate(e, key) from e

    def delete(self, key: str) -> None:
        check_key(key)
        try:
            obstore.delete(self._store, key)
        except (FileNotFoundError, NotFoundError):
            return
        except Exception as e:
            raise self._translate(e, key) from e

    def list(self, prefix: str = "") -> Iterator[str]:
        """A bucket that does not exist yet holds nothing (S3-compatible stores such as
        SeaweedFS create it on the first put)."""
        try:
            for batch in obstore.list(self._store, prefix or None):
                for meta in batch:
                    yield str(meta["path"])
        except Exception as e:
            if _no_bucket(e):
                return
            raise self._translate(e, prefix or "/") from e

    def _translate(self, e: Exception, key: str) -> TierError:
        log.debug("tier %s: %s on %s: %s", self.name, type(e).__name__, key, e)
        if isinstance(e, (FileNotFoundError, NotFoundError)):
            return ObjectNotFound(f"tier {self.name}: no object {key}")
        if isinstance(e, AlreadyExistsError):
            return ObjectExists(f"tier {self.name}: {key} exists")
        if _no_bucket(e):  # a configuration error, not an outage to wait out
            return TierError(f"tier {self.name}: the bucket does not exist")
        if isinstance(e, (PermissionDeniedError, UnauthenticatedError, PermissionError)):
            return TierError(f"tier {self.name}: access denied (check the credentials)")
        if isinstance(e, (GenericError, ConnectionError, TimeoutError, OSError)):
            return TierUnavailable(f"tier {self.name}: object store unavailable")
        return TierError(f"tier {self.name}: {type(e).__name__} on {key}")


def _no_bucket(e: Exception) -> bool:
    return "NoSuchBucket" in str(e)


def _range_refused(e: Exception) -> bool:
    """A range request the store answered 416, or that obstore found longer than the object."""
    if isinstance(e, (FileNotFoundError, NotFoundError)):
        return False
    text = str(e)
    return "416" in text or "not satisfiable" in text.lower() or "InvalidRange" in text
