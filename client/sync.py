"""`VaultClient`: the blocking face of `AsyncVaultClient`, for training loops and scripts.

It runs one private event loop on a daemon thread and hands each call to it, so the
connection pool is shared by every call and by threads that use the same client.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import io
import os
import threading
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, Literal, TypeVar, overload

import aiohttp

from .aio import AsyncVaultClient, UploadSession
from .background import Prepare, SaveHandle, snapshot_files
from .chunking import FileSpec
from .models import Checkpoint, Transfer
from .transport import RetryPolicy

T = TypeVar("T")
OPEN_BUFFER = 1 << 20  # range reads of at least this much; torch.load reads in small pieces
PREFETCH = 4 << 20  # bytes a sequential reader's stream fetches ahead of it


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
        if self._loop.is_running():
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
        raw = _RemoteFile(self, namespace, ckpt.id, name, int(ckpt.files[name]["size"]))
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


class _RemoteFile(io.RawIOBase):
    """Raw, seekable reads of one stored file. A read that starts where the last one ended
    continues one streamed GET (torch.load, a copy: one request for the whole run); any
    other read is one Range request, and drops the stream."""

    def __init__(
        self, client: VaultClient, namespace: str, checkpoint_id: str, name: str, size: int
    ) -> None:
        super().__init__()
        self._client = client
        self._where = (namespace, checkpoint_id, name)
        self._size = size
        self._pos = 0
        self._last_end = 0  # where the previous read stopped: a read from here is sequential
        self._stream: aiohttp.ClientResponse | None = None
        self._spare = b""  # delivered by the stream, not yet read
        self._ahead: concurrent.futures.Future[bytes] | None = None  # the next piece, on its way
        self.name = name

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        want = min(len(view), self._size - self._pos)
        if want <= 0:
            return 0
        ns, cid, name = self._where
        data = self._streamed(want) if self._pos == self._last_end else None
        if data is None:  # not sequential, or the stream broke: a Range request (retried)
            self._drop_stream()
            data = self._client.read_range(ns, cid, name, self._pos, want)
        view[: len(data)] = data
        self._pos += len(data)
        self._last_end = self._pos
        return len(data)

    def readall(self) -> bytes:
        """The rest of the file in one read, not the default 8 KiB at a time."""
        out = bytearray(self._size - self._pos)
        n = self.readinto(out) if out else 0
        while 0 < n < len(out):
            got = self.readinto(memoryview(out)[n:])
            if not got:
                break
            n += got
        return bytes(out[:n])

    def _streamed(self, want: int) -> bytes | None:
        """The next `want` bytes (fewer if fewer are ready) from the stream. Everything the
        stream has delivered but the caller not yet taken is contiguous with the last read
        (`_spare`, then `_ahead`), since any other read drops the stream. The next piece is
        requested as soon as one is handed out, so the transfer overlaps whatever the
        caller does with it (torch.load turning bytes into tensors)."""
        ns, cid, name = self._where
        try:
            if not self._spare and self._ahead is not None:
                ahead, self._ahead = self._ahead, None
                self._spare = ahead.result()
            if not self._spare:
                if self._stream is None:
                    self._stream = self._client._run(
                        self._client.aio.open_file(ns, cid, name, self._pos)
                    )
                self._spare = self._client._run(_read_up_to(self._stream, want))
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return None
        data, self._spare = self._spare[:want], self._spare[want:]
        if self._stream is not None and self._ahead is None:
            self._ahead = asyncio.run_coroutine_threadsafe(
                _read_up_to(self._stream, max(want, PREFETCH)), self._client._loop
            )
        return data if data else None

    def _drop_stream(self) -> None:
        self._spare = b""
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            with contextlib.suppress(Exception):
                ahead.result()
        if self._stream is not None:
            stream, self._stream = self._stream, None
            self._client._run(_release(stream))

    def close(self) -> None:
        if not self.closed:
            self._drop_stream()
        super().close()


async def _read_up_to(resp: aiohttp.ClientResponse, n: int) -> bytes:
    """Up to n bytes of the body: fewer only at its end."""
    parts: list[bytes] = []
    got = 0
    while got < n:
        piece = await resp.content.read(n - got)
        if not piece:
            break
        parts.append(piece)
        got += len(piece)
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def _release(resp: aiohttp.ClientResponse) -> None:
    resp.release()
