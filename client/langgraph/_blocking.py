"""`VaultSaver`: the saver for synchronous LangGraph programs (`graph.invoke`, `stream`).

It is `AsyncVaultSaver` over a `VaultClient` (its own client, or a shared one). LangGraph
calls a sync saver from several threads at once (puts and writes go through a thread
pool): each put and put_writes runs its steps (`_steps.py`) on the thread that called it,
so its small save goes out from there over the client's connection pool with no hop to the
client's loop thread and back (bench_langgraph: put p50 4.0 -> 3.0 ms, client CPU per call
~1.0 -> ~0.65 ms); reads and whole-thread operations run as coroutines on that loop.
Its async methods work too, from any loop. Fork safety and closing at exit come with the
client.
"""

from __future__ import annotations

from langgraph.checkpoint.serde.base import SerializerProtocol

from ..sync import VaultClient
from ..transport import RetryPolicy
from . import _steps as steps
from ._calls import Found, Put, Where, Writes
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
        vault = VaultClient(
            url, token, connections=connections, retry=retry, timeout=timeout, progress=False
        )
        self._on(vault, prefix, keep_last, cache_bytes, serde)
        self._owned: VaultClient | None = vault  # closed with the saver

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
        saver._on(vault, prefix, keep_last, cache_bytes, serde)
        saver._owned = None  # not ours
        return saver

    def _on(
        self,
        vault: VaultClient,
        prefix: str,
        keep_last: int | None,
        cache_bytes: int,
        serde: SerializerProtocol | None,
    ) -> None:
        AsyncVaultSaver.__init__(
            self,
            vault.aio,
            prefix=prefix,
            keep_last=keep_last,
            cache_bytes=cache_bytes,
            serde=serde,
        )
        self._memo.loop = vault._loop
        self._vault = vault

    def _put_blocking(self, put: Put) -> None:
        steps.run_here(self._put_steps(put), self._vault, self._staging)
        # a listing and a delete now and then, on the loop; not inside an atomic block
        if self.keep_last is not None and self._staging is None:
            self._block(self._prune_now_and_then(put.key[0], self.keep_last))

    def _writes_blocking(self, req: Writes) -> None:
        steps.run_here(self._writes_steps(req), self._vault, self._staging)

    def _find_blocking(self, where: Where) -> Found | None:
        return steps.run_here(self._find(where), self._vault)

    def close(self) -> None:
        """Close the connections and stop the loop thread (unless they are a shared
        client's); the saver is unusable after. A forked child's copy: nothing to do."""
        if self._owned is not None:
            self._owned.close()

    def __enter__(self) -> VaultSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
