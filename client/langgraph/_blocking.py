"""`VaultSaver`: the saver for synchronous LangGraph programs (`graph.invoke`, `stream`).

It is `AsyncVaultSaver` with an event loop of its own on a daemon thread, the way
`VaultClient` wraps `AsyncVaultClient`: LangGraph calls a sync saver from several threads
at once (puts and writes go through a thread pool), and every call becomes a coroutine on
that one loop, sharing one connection pool. Its async methods work too, from any loop.
"""

from __future__ import annotations

import asyncio
import os
import threading

from langgraph.checkpoint.serde.base import SerializerProtocol

from ..aio import AsyncVaultClient
from ..forksafe import inert_after_fork
from ..sync import VaultClient
from ..transport import RetryPolicy
from ._memo import CACHE_BYTES
from ._saver import AsyncVaultSaver


class VaultSaver(AsyncVaultSaver):
    """A LangGraph checkpointer for sync code:

        with VaultSaver(url, token, keep_last=50) as saver:
            graph = builder.compile(checkpointer=saver)
            graph.invoke(inputs, {"configurable": {"thread_id": "chat-42"}})

    `url` and `token` default to CKPT_URL / CKPT_TOKEN like `VaultClient`; `prefix`,
    `keep_last`, `cache_bytes` and `serde` as in `AsyncVaultSaver`. A program that has a
    `VaultClient` already can share its connections and loop thread: `sharing(vault)`.
    """

    _thread: threading.Thread | None

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        prefix: str = "langgraph",
        keep_last: int | None = None,
        cache_bytes: int = CACHE_BYTES,
        serde: SerializerProtocol | None = None,
        connections: int = 8,
        retry: RetryPolicy | None = None,
        timeout: float = 300.0,
    ) -> None:
        client = AsyncVaultClient(
            url, token, connections=connections, retry=retry, timeout=timeout, progress=False
        )
        super().__init__(
            client, prefix=prefix, keep_last=keep_last, cache_bytes=cache_bytes, serde=serde
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="ckpt-langgraph", daemon=True
        )
        self._thread.start()
        self._memo.loop = self._loop
        self._pid = inert_after_fork(self)

    @classmethod
    def sharing(
        cls,
        vault: VaultClient,
        *,
        prefix: str = "langgraph",
        keep_last: int | None = None,
        cache_bytes: int = CACHE_BYTES,
        serde: SerializerProtocol | None = None,
    ) -> VaultSaver:
        """A saver on `vault`'s connection pool and loop thread (no second pool, no second
        thread); closing the saver leaves `vault` open, and `vault` must outlive it."""
        saver = cls.__new__(cls)
        AsyncVaultSaver.__init__(
            saver,
            vault.aio,
            prefix=prefix,
            keep_last=keep_last,
            cache_bytes=cache_bytes,
            serde=serde,
        )
        saver._loop = vault._loop
        saver._thread = None  # not ours
        saver._memo.loop = vault._loop
        saver._pid = os.getpid()
        return saver

    def close(self) -> None:
        """Close the connections and stop the loop thread (unless they are a shared
        client's); the saver is unusable after."""
        if self._thread is None:
            return
        if os.getpid() == self._pid and self._loop.is_running():  # a forked copy: inert
            asyncio.run_coroutine_threadsafe(self.client.close(), self._loop).result()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def __enter__(self) -> VaultSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
