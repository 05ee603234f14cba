"""What the endpoint keeps between requests: each bucket's open upload, its lock, and the
multipart uploads in progress.

One process serves the endpoint (the one that writes the data dir, api/s3/app.py), so this
state lives in its memory, one `S3State` per app (no globals). The open uploads themselves
are catalog records (vault/uploads.py): after a restart `recover` finds them again by
their `s3` metadata, and objects written before it are still there. Multipart uploads in
progress are not recovered: their parts stay in the open upload until it is committed
(then they are dropped), and the client's Complete answers NoSuchUpload, as S3 does for
an aborted upload; SDKs then upload the object again.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from checkpoint_vault.vault import FileEntry, Vault

Domain = Callable[[str], bool] | None


@dataclass
class OpenUpload:
    """A bucket's upload being filled: the checkpoint to come."""

    upload_id: str
    opened_at: float
    last_write: float
    by: str | None


@dataclass
class Multipart:
    """One multipart upload: where it goes, and each part's stored entry by number."""

    bucket: str
    key: str
    by: str
    parts: dict[int, FileEntry] = field(default_factory=dict)


@dataclass
class S3State:
    opened: dict[str, OpenUpload] = field(default_factory=dict)  # namespace -> open upload
    multipart: dict[str, Multipart] = field(default_factory=dict)  # upload id -> upload
    _locks: dict[str, BucketLock] = field(default_factory=dict)
    # In a cluster: the replica epoch `opened` was found again under (api/s3/cluster.py),
    # and the lock that makes one request do it when this process starts owning its shard.
    epoch: int | None = None
    recovering: asyncio.Lock = field(default_factory=asyncio.Lock)

    def lock(self, ns: str) -> BucketLock:
        """The bucket's lock (`BucketLock`)."""
        return self._locks.setdefault(ns, BucketLock())

    def new_multipart(self, bucket: str, key: str, by: str) -> str:
        upload_id = secrets.token_urlsafe(24)
        self.multipart[upload_id] = Multipart(bucket, key, by)
        return upload_id

    def recover(self, vault: Vault, now: float) -> None:
        """The open uploads of a previous run (the newest per namespace; the others are left
        to expire, nothing of them is visible)."""
        self.opened.update(open_uploads(vault, now))


def open_uploads(vault: Vault, now: float) -> dict[str, OpenUpload]:
    """The buckets' open uploads in the catalog, the newest per namespace (blocking)."""
    found = {}
    for session in vault.uploads.open_sessions():  # oldest first
        if isinstance(session.metadata.get("s3"), dict):
            found[session.namespace] = OpenUpload(
                session.id, session.created_at, now, session.created_by
            )
    return found


class BucketLock:
    """Writes of objects share a bucket; a commit, a delete or the idle rule has it alone
    (a marker's commit then sees every object written before it, whole)."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._writers = 0
        self._alone = False
        self.opening = asyncio.Lock()  # one open upload per bucket, however many writers

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._alone)
            self._writers += 1
        try:
            yield
        finally:
            async with self._cond:
                self._writers -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._alone and self._writers == 0)
            self._alone = True
        try:
            yield
        finally:
            async with self._cond:
                self._alone = False
                self._cond.notify_all()
