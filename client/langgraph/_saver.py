"""`AsyncVaultSaver`: a LangGraph checkpoint saver backed by a Checkpoint Vault server.

How LangGraph calls a saver shapes this module. A run of a graph makes one `get_tuple`,
then per super-step one `put` and one `put_writes` per task; the puts run in the
background, each after the previous one, and the writes of a checkpoint's tasks are sent
while its put may still be on its way or not even started. So:

- every operation is one or a few HTTP requests; a put is one request (the vault's
  one-request save) carrying every channel value, deduplicated by the vault's small
  chunks rather than by tracking channel versions here;
- vault records are immutable and ordered by commit, so pending writes are records of
  their own, committed after their checkpoint. Writes that arrive before their
  checkpoint's put has started are also folded into that checkpoint's record, and writes
  that arrive while it is on its way wait for it. Hence, reading newest first, a
  checkpoint's writes are the writes records met before it plus those inside it: one
  listing finds the latest checkpoint and all of its writes;
- all network work runs on one event loop (the caller's, or `VaultSaver`'s own thread),
  so the bookkeeping above needs no locks; serializing and deserializing values happen in
  the caller, off that loop.

Record layout, tags and names: `_layout.py`; file bytes: `_codec.py`; pruning:
`_retention.py`.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import random
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Iterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

import blake3
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from ..aio import AsyncVaultClient
from ..errors import IntegrityError, NotFound
from ..models import Checkpoint as Record
from ._codec import Contents, StoredWrite, Typed, decode, encode, merge_writes
from ._layout import (
    CHECKPOINT_FILE,
    CHUNKING,
    KIND_CHECKPOINT,
    KIND_WRITES,
    WRITES_FILE,
    Layout,
    Ref,
    id_tag,
    ns_tag,
    record_metadata,
    record_tags,
)
from ._retention import plan_prune

T = TypeVar("T")
K = TypeVar("K")
Key = tuple[str, str, str]  # (vault namespace, checkpoint_ns, checkpoint_id)

FIRST_PAGE = 4  # the latest checkpoint is usually the newest record or close to it
PAGE = 200  # records per listing after the first page
DELETES_IN_FLIGHT = 8
REMEMBERED = 4096  # checkpoints whose vault id we keep (parents, "already committed")
EARLY_KEYS = 256  # checkpoints with early writes waiting for their put


class _Lru(Generic[K, T]):
    """A dict that forgets its oldest entries past `cap`: bookkeeping must stay bounded in
    a process that serves threads for weeks."""

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._d: OrderedDict[K, T] = OrderedDict()

    def get(self, key: K) -> T | None:
        return self._d.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def put(self, key: K, value: T) -> None:
        self._d[key] = value
        self._d.move_to_end(key)
        while len(self._d) > self._cap:
            self._d.popitem(last=False)

    def pop(self, key: K) -> T | None:
        return self._d.pop(key, None)


@dataclass
class _Shared:
    """What every copy of one saver shares (`with_allowlist` makes shallow copies that
    differ only in their serializer). Touched only on `loop`."""

    loop: asyncio.AbstractEventLoop | None
    committed: _Lru[Key, str] = field(default_factory=lambda: _Lru(REMEMBERED))
    inflight: dict[Key, asyncio.Future[None]] = field(default_factory=dict)
    early: _Lru[Key, list[StoredWrite]] = field(default_factory=lambda: _Lru(EARLY_KEYS))
    puts_since_prune: _Lru[str, int] = field(default_factory=lambda: _Lru(REMEMBERED))
    pruning: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class _Where:
    namespace: str
    thread_id: str
    checkpoint_ns: str | None  # None: every checkpoint_ns (list only)
    checkpoint_id: str | None


@dataclass
class _Found:
    record: Record
    data: bytes
    writes: builtins.list[tuple[Record, bytes]]


@dataclass(frozen=True)
class _Put:
    key: Key
    parent: Key | None
    channels: dict[str, Typed]
    document: Typed
    metadata: dict[str, Any]
    tags: builtins.list[str]


@dataclass(frozen=True)
class _Writes:
    key: Key
    writes: builtins.list[StoredWrite]
    metadata: dict[str, Any]
    tags: builtins.list[str]


class AsyncVaultSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer over an `AsyncVaultClient`:

        async with AsyncVaultClient(url, token) as client:
            graph = builder.compile(checkpointer=AsyncVaultSaver(client))

    `prefix`: the namespaces' first segments (each thread is `<prefix>/<thread>`).
    `keep_last`: keep only the newest n checkpoints of each thread and checkpoint_ns (with
    their pending writes); pruned every ~n/4 puts. None keeps everything.

    The synchronous methods work from other threads while the client's event loop runs;
    for synchronous programs use `VaultSaver`, which brings its own loop.
    """

    def __init__(
        self,
        client: AsyncVaultClient,
        *,
        prefix: str = "langgraph",
        keep_last: int | None = None,
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(serde=serde)
        if keep_last is not None and keep_last < 1:
            raise ValueError("keep_last must be at least 1 (or None to keep everything)")
        self.client = client
        self.layout = Layout(prefix)
        self.keep_last = keep_last
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None  # bound by the first async call
        self._shared = _Shared(loop)

    # -- running on the saver's loop --------------------------------------------------
    async def _here(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await `coro` on the saver's loop, from whichever loop the caller runs."""
        running = asyncio.get_running_loop()
        if self._shared.loop is None:
            self._shared.loop = running
        if self._shared.loop is running:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._shared.loop))

    def _block(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the saver's loop and wait for it, from a thread outside that loop."""
        loop = self._shared.loop
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop:
            coro.close()
            raise RuntimeError(
                "synchronous AsyncVaultSaver call with no event loop to run it on (or from "
                "that loop itself): use the a* methods in async code, VaultSaver in sync code"
            )
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    # -- configs ----------------------------------------------------------------------
    def _where(self, config: RunnableConfig, *, any_ns: bool = False) -> _Where:
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        ns = conf.get("checkpoint_ns")
        return _Where(
            self.layout.namespace(thread_id),
            thread_id,
            None if ns is None and any_ns else str(ns or ""),
            conf.get("checkpoint_id") or None,
        )

    # -- get --------------------------------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        found = self._block(self._find(self._where(config)))
        return None if found is None else self._tuple(found, config)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        found = await self._here(self._find(self._where(config)))
        return None if found is None else self._tuple(found, config)

    async def _find(self, where: _Where) -> _Found | None:
        """The checkpoint (by id, else the latest of its checkpoint_ns) and its writes."""
        cid = where.checkpoint_id
        tag = id_tag(cid) if cid else ns_tag(where.checkpoint_ns or "")
        writes: builtins.list[tuple[Ref, Record]] = []
        async with aclosing(self._records(where.namespace, tag=tag)) as records:
            async for rec in records:
                ref = Ref.of(rec)
                if ref is None or ref.checkpoint_ns != where.checkpoint_ns:
                    continue
                if cid and ref.checkpoint_id != cid:
                    continue
                if ref.kind == KIND_WRITES:
                    writes.append((ref, rec))
                    continue
                mine = [w for r, w in writes if r.checkpoint_id == ref.checkpoint_id]
                return await self._fetch(rec, ref, mine)
        return None

    async def _records(
        self, namespace: str, *, tag: str | None = None, first: int = FIRST_PAGE
    ) -> AsyncGenerator[Record, None]:
        """Records of a namespace newest first, page by page (none if it does not exist)."""
        before, size = None, first
        while True:
            try:
                page = await self.client.list(namespace, limit=size, before=before, tag=tag)
            except NotFound:
                return
            for rec in page:
                yield rec
            if len(page) < size:
                return
            before, size = page[-1].id, PAGE

    async def _fetch(self, rec: Record, ref: Ref, writes: builtins.list[Record]) -> _Found:
        self._shared.committed.put((rec.namespace, ref.checkpoint_ns, ref.checkpoint_id), rec.id)
        data, *blobs = await asyncio.gather(
            self._read(rec, CHECKPOINT_FILE), *(self._read(w, WRITES_FILE) for w in writes)
        )
        return _Found(rec, data, list(zip(writes, blobs, strict=True)))

    async def _read(self, rec: Record, name: str) -> bytes:
        info = rec.files.get(name)
        if info is None:
            raise IntegrityError(f"record {rec.id} in {rec.namespace} has no file {name!r}")
        size = int(info["size"])
        data = await self.client.read_range(rec.namespace, rec.id, name, 0, size)
        if len(data) != size or blake3.blake3(data).hexdigest() != info["hash"]:
            raise IntegrityError(f"{rec.namespace} {rec.id} {name}: bytes do not match the hash")
        return data

    def _tuple(self, found: _Found, config: RunnableConfig | None = None) -> CheckpointTuple:
        """Deserialize, in the caller: values can be large and the loop is shared."""
        md = found.record.metadata
        thread_id, ns, cid = md["thread_id"], md["checkpoint_ns"], md["checkpoint_id"]
        contents = decode(found.data)
        if contents.checkpoint is None:
            raise IntegrityError(f"record {found.record.id} holds no checkpoint document")
        document = self.serde.loads_typed(contents.checkpoint)
        values = {k: self.serde.loads_typed(v) for k, v in contents.channels.items()}
        batches = [(found.record.id, contents.writes)]
        batches += [(rec.id, decode(data).writes) for rec, data in found.writes]
        batches.sort(key=lambda b: b[0])  # vault ids increase in commit order
        pending = [
            (w.task_id, w.channel, self.serde.loads_typed(w.value))
            for w in merge_writes(b for _, b in batches)
        ]
        parent = md.get("parent_checkpoint_id")
        return CheckpointTuple(
            config=config
            if config is not None and config["configurable"].get("checkpoint_id")
            else _config(thread_id, ns, cid),
            checkpoint=cast(Checkpoint, {**document, "channel_values": values}),
            metadata=cast(CheckpointMetadata, md.get("metadata") or {}),
            parent_config=_config(thread_id, ns, parent) if parent else None,
            pending_writes=pending,
        )

    # -- put --------------------------------------------------------------------------
    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        put = self._encode_put(config, checkpoint, metadata)
        self._block(self._store_checkpoint(put))
        return _config(put.metadata["thread_id"], put.key[1], put.key[2])

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        put = self._encode_put(config, checkpoint, metadata)
        await self._here(self._store_checkpoint(put))
        return _config(put.metadata["thread_id"], put.key[1], put.key[2])

    def _encode_put(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata
    ) -> _Put:
        where = self._where(config)
        ns = where.checkpoint_ns or ""
        cid = checkpoint["id"]
        document = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        values = checkpoint["channel_values"]
        md = record_metadata(KIND_CHECKPOINT, where.thread_id, ns, cid)
        md["parent_checkpoint_id"] = where.checkpoint_id
        # As SQLite's saver: JSON, so metadata filters compare what json.loads gives back.
        md["metadata"] = json.loads(
            json.dumps(get_serializable_checkpoint_metadata(config, metadata), ensure_ascii=False)
        )
        return _Put(
            key=(where.namespace, ns, cid),
            parent=(where.namespace, ns, where.checkpoint_id) if where.checkpoint_id else None,
            channels={k: self.serde.dumps_typed(v) for k, v in values.items()},
            document=self.serde.dumps_typed(document),
            metadata=md,
            tags=record_tags(KIND_CHECKPOINT, ns, cid),
        )

    async def _store_checkpoint(self, put: _Put) -> None:
        shared = self._shared
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        shared.inflight[put.key] = done
        try:
            early = shared.early.pop(put.key) or []
            data = encode(Contents(put.channels, early, put.document))
            parent = shared.committed.get(put.parent) if put.parent else None
            rec = await self._save(put.key[0], CHECKPOINT_FILE, data, put, parent)
            shared.committed.put(put.key, rec.id)
        finally:
            del shared.inflight[put.key]
            done.set_result(None)
        if self.keep_last is not None:
            await self._prune_now_and_then(put.key[0], self.keep_last)

    async def _save(
        self, namespace: str, name: str, data: bytes, what: _Put | _Writes, parent: str | None
    ) -> Record:
        """One-request save; `parent` (a vault id) gives the vault the same lineage."""
        md, tags = what.metadata, what.tags
        try:
            return await self.client.save(
                namespace, {name: data}, parent=parent, metadata=md, tags=tags, chunking=CHUNKING
            )
        except NotFound:
            if parent is None:
                raise
            # The parent record was pruned since we saw it: the vault's lineage stops here;
            # LangGraph's own parent id is in the metadata either way.
            return await self.client.save(
                namespace, {name: data}, metadata=md, tags=tags, chunking=CHUNKING
            )

    # -- put_writes -------------------------------------------------------------------
    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._block(self._store_writes(self._encode_writes(config, writes, task_id, task_path)))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._here(
            self._store_writes(self._encode_writes(config, writes, task_id, task_path))
        )

    def _encode_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> _Writes:
        where = self._where(config)
        ns, cid = where.checkpoint_ns or "", str(where.checkpoint_id)
        dumps = self.serde.dumps_typed
        stored = [
            StoredWrite(task_id, task_path, ch, WRITES_IDX_MAP.get(ch, i), dumps(v))
            for i, (ch, v) in enumerate(writes)
        ]
        md = record_metadata(KIND_WRITES, where.thread_id, ns, cid)
        md["task_id"] = task_id
        return _Writes((where.namespace, ns, cid), stored, md, record_tags(KIND_WRITES, ns, cid))

    async def _store_writes(self, req: _Writes) -> None:
        shared = self._shared
        pending = shared.inflight.get(req.key)
        if pending is not None:
            await asyncio.shield(pending)  # commit after the checkpoint, never before it
        elif req.key not in shared.committed:
            # Its put has not started: it will carry these too, in case this record
            # commits first (a reader takes writes older than their checkpoint from it).
            early = shared.early.get(req.key) or []
            shared.early.put(req.key, early + req.writes)
        data = encode(Contents(writes=req.writes))
        await self._save(req.key[0], WRITES_FILE, data, req, None)

    # -- deleting, copying, pruning ---------------------------------------------------
    def delete_thread(self, thread_id: str) -> None:
        self._block(self._delete_thread(str(thread_id)))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._here(self._delete_thread(str(thread_id)))

    async def _delete_thread(self, thread_id: str) -> None:
        ns = self.layout.namespace(thread_id)
        await self._delete([rec async for rec in self._records(ns, first=PAGE)])

    async def _delete(self, records: builtins.list[Record]) -> None:
        slots = asyncio.Semaphore(DELETES_IN_FLIGHT)

        async def one(rec: Record) -> None:
            async with slots:
                with contextlib.suppress(NotFound):  # deleted meanwhile (a concurrent prune)
                    await self.client.delete(rec.namespace, rec.id)

        await asyncio.gather(*(one(rec) for rec in records))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._block(self._delete_for_runs({str(r) for r in run_ids}))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._here(self._delete_for_runs({str(r) for r in run_ids}))

    async def _delete_for_runs(self, run_ids: set[str]) -> None:
        """Every checkpoint whose metadata names one of the runs, with its writes. Reads
        every record under the prefix: the vault has no index on metadata."""
        for ns in await self._thread_namespaces():
            records = [rec async for rec in self._records(ns, first=PAGE)]
            doomed: set[tuple[str, str]] = set()
            for rec in records:
                ref = Ref.of(rec)
                run = (rec.metadata.get("metadata") or {}).get("run_id")
                if ref and ref.kind == KIND_CHECKPOINT and str(run) in run_ids:
                    doomed.add((ref.checkpoint_ns, ref.checkpoint_id))
            await self._delete([r for r in records if _key(r) in doomed])

    async def _thread_namespaces(self) -> builtins.list[str]:
        return [n["name"] for n in await self.client.namespaces() if self.layout.owns(n["name"])]

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._block(self._copy_thread(str(source_thread_id), str(target_thread_id)))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._here(self._copy_thread(str(source_thread_id), str(target_thread_id)))

    async def _copy_thread(self, source: str, target: str) -> None:
        """Fork every record, oldest first so the copy keeps the commit order reads rely on.
        A fork shares the source's chunks: no value bytes are copied or sent."""
        src, dst = self.layout.namespace(source), self.layout.namespace(target)
        records = [rec async for rec in self._records(src, first=PAGE)]
        for rec in reversed(records):
            if Ref.of(rec) is None:
                continue
            await self.client.fork(
                src, rec.id, dst, metadata={**rec.metadata, "thread_id": target}, tags=rec.tags
            )

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._block(self._prune([str(t) for t in thread_ids], strategy))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._here(self._prune([str(t) for t in thread_ids], strategy))

    async def _prune(self, thread_ids: builtins.list[str], strategy: str) -> None:
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}: keep_latest or delete")
        for thread_id in thread_ids:
            if strategy == "delete":
                await self._delete_thread(thread_id)
            else:
                await self._prune_namespace(self.layout.namespace(thread_id), 1)

    async def _prune_namespace(self, namespace: str, keep: int) -> None:
        records = [rec async for rec in self._records(namespace, first=PAGE)]
        await self._delete(plan_prune(records, keep))

    async def _prune_now_and_then(self, namespace: str, keep: int) -> None:
        """Prune a thread every ~keep/4 puts, inside the put that crosses the mark: a thread
        then holds at most ~1.25 x keep checkpoints per checkpoint_ns, and the listing is
        paid once per keep/4 puts, not on every put."""
        shared = self._shared
        count = (shared.puts_since_prune.get(namespace) or 0) + 1
        shared.puts_since_prune.put(namespace, count)
        if count < max(1, keep // 4) or namespace in shared.pruning:
            return
        shared.puts_since_prune.put(namespace, 0)
        shared.pruning.add(namespace)
        try:
            await self._prune_namespace(namespace, keep)
        finally:
            shared.pruning.discard(namespace)

    # -- versions ---------------------------------------------------------------------
    def get_next_version(self, current: str | None, channel: None) -> str:
        """Zero-padded counter plus a random fraction, as LangGraph's own savers: string
        order is numeric order, and two branches of a thread never mint equal versions."""
        if current is None:
            n = 0
        elif isinstance(current, int):
            n = current
        else:
            n = int(str(current).split(".")[0])
        return f"{n + 1:032}.{random.random():016}"  # noqa: S311 - not security

    # -- list (named like the builtin, so it comes last) ------------------------------
    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        scan = self._scan(config, filter, before, limit)
        try:
            while (found := await self._here(_next(scan))) is not None:
                yield self._tuple(found)
        finally:
            await self._here(_close(scan))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        scan = self._scan(config, filter, before, limit)
        try:
            while (found := self._block(_next(scan))) is not None:
                yield self._tuple(found)
        finally:
            self._block(_close(scan))

    async def _scan(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> AsyncGenerator[_Found, None]:
        """Checkpoints newest first per thread, with their writes (met before them)."""
        where = self._where(config, any_ns=True) if config else None
        namespaces = [where.namespace] if where else await self._thread_namespaces()
        before_id = (before or {}).get("configurable", {}).get("checkpoint_id")
        left = limit
        for namespace in namespaces:
            if left is not None and left <= 0:
                return
            tag = None
            if where and where.checkpoint_id:
                tag = id_tag(where.checkpoint_id)
            elif where and where.checkpoint_ns is not None:
                tag = ns_tag(where.checkpoint_ns)
            writes: dict[tuple[str, str], builtins.list[Record]] = {}
            async with aclosing(self._records(namespace, tag=tag, first=PAGE)) as records:
                async for rec in records:
                    ref = Ref.of(rec)
                    if ref is None:
                        continue
                    key = (ref.checkpoint_ns, ref.checkpoint_id)
                    if ref.kind == KIND_WRITES:
                        writes.setdefault(key, []).append(rec)
                        continue
                    mine = writes.pop(key, [])
                    if not _wanted(rec, ref, where, before_id, filter):
                        continue
                    yield await self._fetch(rec, ref, mine)
                    if left is not None:
                        left -= 1
                        if left <= 0:
                            return


async def _next(scan: AsyncIterator[_Found]) -> _Found | None:
    try:
        return await anext(scan)
    except StopAsyncIteration:
        return None


def _key(rec: Record) -> tuple[str, str] | None:
    ref = Ref.of(rec)
    return None if ref is None else (ref.checkpoint_ns, ref.checkpoint_id)


async def _close(scan: AsyncGenerator[_Found, None]) -> None:
    await scan.aclose()


def _wanted(
    rec: Record,
    ref: Ref,
    where: _Where | None,
    before_id: str | None,
    filter: dict[str, Any] | None,
) -> bool:
    if where is not None:
        if where.checkpoint_ns is not None and ref.checkpoint_ns != where.checkpoint_ns:
            return False
        if where.checkpoint_id and ref.checkpoint_id != where.checkpoint_id:
            return False
    if before_id and ref.checkpoint_id >= before_id:
        return False
    metadata = rec.metadata.get("metadata") or {}
    return all(metadata.get(k) == v for k, v in (filter or {}).items())


def _config(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
        }
    }
