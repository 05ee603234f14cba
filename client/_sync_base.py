"""The hand-written part of `VaultClient`: what a blocking face has and a coroutine API
does not. Every other method is generated from `AsyncVaultClient` (client/_gen_sync.py).

It owns the loop thread every call runs on (one per client, so one connection pool serves
every thread of the program), the small saves sent from the caller's own thread (the same
connection pool, no hop to the loop: `_here_save`), the context manager and `close`, the
blocking seekable file of `open`, and the closing of a client the program never closed: a
finalizer closes its connections when it is collected or, at the latest, at interpreter
exit, so a script that forgets `close()` leaves no connection open and no background save
unfinished.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import weakref
from collections.abc import Coroutine, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from .background import BackgroundSaveFailed, SaveHandle
from .chunking import FileSpec, collect_sources, contents
from .forksafe import inert_after_fork
from .loopthread import LoopThread
from .models import Checkpoint, Transfer
from .options import SaveFields, SaveOptions
from .remotefile import RemoteFile

if TYPE_CHECKING:
    from typing_extensions import Self, Unpack

    from .aio import AsyncVaultClient

T = TypeVar("T")
OPEN_BUFFER = 1 << 20  # range reads of at least this much; torch.load reads in small pieces


class BlockingClient:
    def __init__(self, aio: AsyncVaultClient) -> None:
        self.aio = aio
        self._thread = LoopThread("ckpt-client")
        inert_after_fork(self)
        self._closer = weakref.finalize(self, _close_unclosed, self._thread, aio)

    @property
    def _loop(self) -> asyncio.AbstractEventLoop:
        return self._thread.loop

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._thread.run(coro)

    def _here_save(
        self,
        namespace: str,
        files: FileSpec | Mapping[str, FileSpec],
        *,
        background: bool,
        **options: Unpack[SaveFields],
    ) -> Checkpoint | SaveHandle:
        """`save`: a small one (the one-request path) is sent from this thread, which waits
        for it anyway; anything else runs on the loop thread."""
        opts = SaveOptions.of(options)
        if not background:
            sources = collect_sources(files)
            if self.aio._fits_one_request(sources):
                self._thread.check_owner()
                return self.aio._save_small_here(namespace, contents(sources), opts)
            return self._run(self.aio._save_sources(namespace, sources, opts))
        handle: SaveHandle = self._run(self.aio.save(namespace, files, background=True, **options))
        return handle

    def _here_list(
        self,
        namespace: str,
        *,
        limit: int = 100,
        before: str | None = None,
        tag: str | None = None,
        validity: str | None = None,
        durable: bool = False,
    ) -> list[Checkpoint]:
        """`list`: one small request, sent from this thread, which waits for it anyway
        (LangGraph's `VaultSaver.get_tuple` lists once per graph run)."""
        self._thread.check_owner()
        return self.aio._list_here(namespace, limit, before, tag, validity, durable)

    def _list_wire_here(
        self, namespace: str, limit: int, before: str | None, tag: str | None
    ) -> list[dict[str, Any]]:
        """A page of records as the server's JSON, from this thread (`_here_list`'s
        request; LangGraph's `VaultSaver.get_tuple` makes records only of what it uses)."""
        self._thread.check_owner()
        return self.aio._list_wire_here(namespace, limit, before, tag)

    def _save_bytes_here(
        self, namespace: str, files: Mapping[str, bytes], opts: SaveOptions
    ) -> Checkpoint:
        """`save` of bytes in memory with its options built (LangGraph's `VaultSaver`, whose
        puts are many and small): from this thread when they fit the one-request path,
        else on the loop thread; no per-file sources to make on the way."""
        if sum(len(data) for data in files.values()) <= self.aio.small_save_limit:
            self._thread.check_owner()
            return self.aio._save_small_here(namespace, list(files.items()), opts)
        return self._run(self.aio._save_sources(namespace, collect_sources(files), opts))

    def _post_bytes_here(
        self, namespace: str, files: Mapping[str, bytes], opts: SaveOptions, *, parse: bool
    ) -> Any:
        """`_save_bytes_here` for a caller that needs less than a checked `Checkpoint`: a
        one-request save's answer as its JSON, or with `parse=False` not read at all (its
        status is: errors raise as ever); a save too large for one request answers its
        `Checkpoint`."""
        if sum(len(data) for data in files.values()) <= self.aio.small_save_limit:
            self._thread.check_owner()
            return self.aio._post_small_here(namespace, list(files.items()), opts, parse=parse)
        return self._run(self.aio._save_sources(namespace, collect_sources(files), opts))

    @property
    def url(self) -> str:
        return self.aio.url

    @property
    def transfer(self) -> Transfer:
        return self.aio.transfer

    def close(self) -> None:
        """Waits for background saves first; raises `BackgroundSaveFailed` (once closed)
        if any failed without its handle being asked."""
        if self._closer.detach() is not None:
            self._thread.stop(self.aio.close())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self, namespace: str, ref: str, name: str) -> io.BufferedReader:
        """A seekable, read-only file object that fetches byte ranges on demand."""
        reader = self._run(self.aio._range_reader(namespace, ref, name))
        return io.BufferedReader(RemoteFile(reader, self._thread, name), buffer_size=OPEN_BUFFER)


def _close_unclosed(thread: LoopThread, aio: AsyncVaultClient) -> None:
    """A collected or still-open client at exit: wait for its background saves, close
    its connections, stop its thread. A failed save was logged when it failed."""
    thread.stop_later(_quietly(aio.close()))


async def _quietly(close: Coroutine[Any, Any, None]) -> None:
    with contextlib.suppress(BackgroundSaveFailed):
        await close
