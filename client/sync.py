"""`VaultClient`: the blocking face of `AsyncVaultClient`, for training loops and scripts.

It runs one private event loop on a daemon thread and hands each call to it, so the
connection pool is shared by every call and by threads that use the same client.
"""

from __future__ import annotations

import asyncio
import io
import os
import threading
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, Literal, TypeVar, overload

from .aio import AsyncVaultClient, UploadSession
from .background import Prepare, SaveHandle, snapshot_files
from .chunking import FileSpec
from .errors import ClientError
from .forksafe import inert_after_fork
from .models import Checkpoint, Transfer
from .remotefile import RemoteFile
from .transport import RetryPolicy

T = TypeVar("T")
OPEN_BUFFER = 1 << 20  # range reads of at least this much; torch.load reads in small pieces


class VaultClient:
    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        connections: int = 8,
        retry: RetryPolicy | None = None,
        timeout: float = 300.0,
        progress: bool | None = None,
        max_background_saves: int = 1,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="ckpt-client", daemon=True
        )
        self._thread.start()
        self._pid = inert_after_fork(self)
        self.aio = AsyncVaultClient(
            url,
            token,
            connections=connections,
            retry=retry,
            timeout=timeout,
            progress=progress,
            max_background_saves=max_background_saves,
        )

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if os.getpid() != self._pid:
            coro.close()
            raise ClientError("this VaultClient belongs to the parent process: make one after fork")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def url(self) -> str:
        return self.aio.url

    @property
    def transfer(self) -> Transfer:
        return self.aio.transfer

    def close(self) -> None:
        """Waits for background saves first; raises `BackgroundSaveFailed` (once closed)
        if any failed without its handle being asked."""
        if os.getpid() == self._pid and self._loop.is_running():
            try:
                self._run(self.aio.close())
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join()
                self._loop.close()

    def __enter__(self) -> VaultClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @overload
    def save(
        self,
        namespace: str,
        files: FileSpec | Mapping[str, FileSpec],
        *,
        parent: str | None = None,
        inherit: bool = False,
        metadata: dict[str, Any] | None = None,
        tags: list[str] | None = None,
        chunking: str | dict[str, int] | None = None,
        background: Literal[False] = False,
    ) -> Checkpoint: ...
    @overload
    def save(
        self,
        namespace: str,
        files: FileSpec | Mapping[str, FileSpec],
        *,
        parent: str | None = None,
        inherit: bool = False,
        metadata: dict[str, Any] | None = None,
        tags: list[str] | None = None,
        chunking: str | dict[str, int] | None = None,
        background: Literal[True],
    ) -> SaveHandle: ...
    def save(
        self,
        namespace: str,
        files: FileSpec | Mapping[str, FileSpec],
        *,
        parent: str | None = None,
        inherit: bool = False,
        metadata: dict[str, Any] | None = None,
        tags: list[str] | None = None,
        chunking: str | dict[str, int] | None = None,
        background: bool = False,
    ) -> Checkpoint | SaveHandle:
        """`background=True`: read the files into memory here (the only wait), upload them
        on the client's thread, and return a `SaveHandle` at once."""

        def upload(snapshot: FileSpec | Mapping[str, FileSpec]) -> Coroutine[Any, Any, Checkpoint]:
            return self.aio.save(
                namespace,
                snapshot,
                parent=parent,
                inherit=inherit,
                metadata=metadata,
                tags=tags,
                chunking=chunking,
            )

        if background:
            return self.submit(lambda: upload(snapshot_files(files)))
        return self._run(upload(files))

    def submit(self, prepare: Prepare, *, timeout: float | None = None) -> SaveHandle:
        """Run a save in the background: wait for one of `max_background_saves` slots (at
        most `timeout` seconds, then TimeoutError), run `prepare` here (it takes the
        snapshot and returns the upload coroutine), upload on the client's thread."""
        return self.aio.background.submit(prepare, self._loop, timeout=timeout)

    def flush(self) -> None:
        """Wait for every background save; raise `BackgroundSaveFailed` for failed ones
        whose handles nobody asked."""
        self.aio.background.wait()

    def begin_upload(
        self,
        namespace: str,
        *,
        parent: str | None = None,
        inherit: bool = False,
        metadata: dict[str, Any] | None = None,
        tags: list[str] | None = None,
        chunking: str | dict[str, int] | None = None,
    ) -> UploadSession:
        return self._run(
            self.aio.begin_upload(
                namespace,
                parent=parent,
                inherit=inherit,
                metadata=metadata,
                tags=tags,
                chunking=chunking,
            )
        )

    def send_file(
        self, upload: UploadSession, name: str, file: FileSpec, *, cuts: Sequence[int] = ()
    ) -> dict[str, Any]:
        return self._run(self.aio.send_file(upload, name, file, cuts=cuts))

    def commit(self, upload: UploadSession, files: Mapping[str, Mapping[str, Any]]) -> Checkpoint:
        return self._run(self.aio.commit(upload, files))

    def abort(self, upload: UploadSession) -> None:
        self._run(self.aio.abort(upload))

    def load(
        self, namespace: str, ref: str = "latest-valid", dest: str | os.PathLike[str] = "."
    ) -> Checkpoint:
        return self._run(self.aio.load(namespace, ref, dest))

    def open(self, namespace: str, ref: str, name: str) -> io.BufferedReader:
        """A seekable, read-only file object that fetches byte ranges on demand."""
        ckpt = self.get(namespace, ref)  # pin the id: every range comes from one checkpoint
        if name not in ckpt.files:
            from .errors import NotFound

            raise NotFound(f"checkpoint {ckpt.id} has no file {name!r}")
        raw = RemoteFile(
            self.aio, self._loop, (namespace, ckpt.id, name), int(ckpt.files[name]["size"])
        )
        return io.BufferedReader(raw, buffer_size=OPEN_BUFFER)

    def read_range(self, namespace: str, ref: str, name: str, start: int, length: int) -> bytes:
        return self._run(self.aio.read_range(namespace, ref, name, start, length))

    def get(self, namespace: str, ref: str = "latest") -> Checkpoint:
        return self._run(self.aio.get(namespace, ref))

    def namespaces(self) -> list[dict[str, Any]]:
        return self._run(self.aio.namespaces())

    def lineage(self, namespace: str, ref: str = "latest") -> list[Checkpoint]:
        return self._run(self.aio.lineage(namespace, ref))

    def manifest(self, namespace: str, ref: str) -> dict[str, Any]:
        return self._run(self.aio.manifest(namespace, ref))

    def mark_valid(
        self, namespace: str, checkpoint_id: str, reason: str | None = None
    ) -> Checkpoint:
        return self._run(self.aio.mark_valid(namespace, checkpoint_id, reason))

    def mark_invalid(
        self, namespace: str, checkpoint_id: str, reason: str | None = None
    ) -> Checkpoint:
        return self._run(self.aio.mark_invalid(namespace, checkpoint_id, reason))

    def pin(self, namespace: str, checkpoint_id: str, pinned: bool = True) -> Checkpoint:
        return self._run(self.aio.pin(namespace, checkpoint_id, pinned))

    def tag(self, namespace: str, checkpoint_id: str, tags: list[str]) -> Checkpoint:
        return self._run(self.aio.tag(namespace, checkpoint_id, tags))

    def delete(self, namespace: str, checkpoint_id: str) -> None:
        self._run(self.aio.delete(namespace, checkpoint_id))

    def fork(
        self,
        namespace: str,
        ref: str,
        target: str,
        metadata: dict[str, Any] | None = None,
        tags: list[str] | None = None,
    ) -> Checkpoint:
        return self._run(self.aio.fork(namespace, ref, target, metadata, tags))

    def stats(self) -> dict[str, Any]:
        return self._run(self.aio.stats())

    def health(self) -> dict[str, Any]:
        return self._run(self.aio.health())

    def create_token(self, name: str, scopes: list[str]) -> dict[str, Any]:
        return self._run(self.aio.create_token(name, scopes))

    def tokens(self) -> list[dict[str, Any]]:
        return self._run(self.aio.tokens())

    def revoke_token(self, name: str) -> None:
        self._run(self.aio.revoke_token(name))

    def gc(self, dry_run: bool = False) -> dict[str, Any]:
        return self._run(self.aio.gc(dry_run))

    def policy(self, namespace: str | None = None) -> dict[str, Any]:
        return self._run(self.aio.policy(namespace))

    def set_policy(self, namespace: str | None, changes: dict[str, Any]) -> dict[str, Any]:
        return self._run(self.aio.set_policy(namespace, changes))

    def retention(self, dry_run: bool = True, namespace: str | None = None) -> dict[str, Any]:
        return self._run(self.aio.retention(dry_run, namespace))

    def verify(self, namespace: str | None = None, sample: float = 1.0) -> dict[str, Any]:
        return self._run(self.aio.verify(namespace, sample))

    def tiering(self, dry_run: bool = True) -> dict[str, Any]:
        return self._run(self.aio.tiering(dry_run))

    def catalog_backup(self, to: str | None = None) -> dict[str, Any]:
        return self._run(self.aio.catalog_backup(to))

    def check(self, repair: bool = False) -> dict[str, Any]:
        return self._run(self.aio.check(repair))

    # Named like the builtin, so it comes last: annotations above must see the builtin.
    def list(
        self,
        namespace: str,
        *,
        limit: int = 100,
        before: str | None = None,
        tag: str | None = None,
        validity: str | None = None,
    ) -> list[Checkpoint]:
        return self._run(
            self.aio.list(namespace, limit=limit, before=before, tag=tag, validity=validity)
        )
