"""`AsyncVaultSaver`: a LangGraph checkpoint saver backed by a Checkpoint Vault server.

How LangGraph calls a saver shapes this module. A run of a graph makes one `get_tuple`,
then per super-step one `put` and one `put_writes` per task; the puts run in the
background, each after the previous one, and the writes of a checkpoint's tasks are sent
while its put may still be on its way, or not even started. So:

- a put is one request (the vault's one-request save). The record inherits its parent's
  files and carries only the channel values whose bytes changed, so a step that did not
  touch the message history does not send it; one that did sends it whole and the vault
  stores only its new ~2 KiB chunks;
- vault records are immutable and ordered by commit, so pending writes are records of
  their own, committed after their checkpoint: writes that arrive while its put is on
  the way wait for it; writes that arrive before it started are also folded into the
  checkpoint's own record. Reading newest first, a checkpoint's writes are therefore the
  writes records met before it plus those inside it: one listing finds the latest
  checkpoint and all of its writes;
- reads fetch files in parallel and keep them by content hash (`_memo.FileCache`), so
  reading back what this process just saved costs one listing;
- all network work runs on one event loop (the caller's, or `VaultSaver`'s own thread),
  so the bookkeeping needs no locks; serializing and deserializing values happen in the
  caller, off that loop.

Record layout, tags and names: `_layout.py`; file bytes: `_codec.py`; whole-thread
operations: `_maintenance.py`; what survives pruning: `_retention.py`.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import random
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Iterator, Sequence
from contextlib import aclosing
from functools import partial
from typing import Any, TypeVar, cast

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
from ..errors import Conflict, IntegrityError, NotFound
from ..models import Checkpoint as Record
from ..options import SaveOptions
from . import _atomic
from . import _maintenance as threads
from . import _steps as steps
from ._calls import Found, Put, Value, Where, Writes, close, config_of, next_found, wanted
from ._codec import Contents, StoredWrite, decode, encode, merge_writes
from ._layout import (
    CHECKPOINT_FILE,
    CHUNKING,
    KIND_CHECKPOINT,
    KIND_WRITES,
    WRITES_FILE,
    Layout,
    Ref,
    channel_file,
    id_tag,
    ns_tag,
    record_metadata,
    record_tags,
)
from ._memo import CACHE_BYTES, Held, Memo

T = TypeVar("T")


def _differs(held: tuple[str, int] | None, value: Value) -> bool:
    """Whether `value` is not the parent's file `held` (hash, size): by size first, so a
    message history that grew is never hashed; equal sizes by BLAKE3, as the vault names
    files."""
    if held is None or held[1] != len(value.data):
        return True
    return blake3.blake3(value.data).hexdigest() != held[0]


class AsyncVaultSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer over an `AsyncVaultClient`:

        async with AsyncVaultClient(url, token) as client:
            graph = builder.compile(checkpointer=AsyncVaultSaver(client))

    `prefix`: the namespaces' first segments (each thread is `<prefix>/<thread>`).
    `keep_last`: keep only the newest n checkpoints of each thread (per checkpoint_ns) with
    their pending writes, pruned every ~n/4 puts; None keeps everything.
    `cache_bytes`: file contents kept in memory for reads (by hash, so never stale).

    The synchronous methods work from other threads while the client's event loop runs;
    for synchronous programs use `VaultSaver`, which brings its own loop.
    """

    def __init__(
        self,
        client: AsyncVaultClient,
        *,
        prefix: str = "langgraph",
        keep_last: int | None = None,
        cache_bytes: int = CACHE_BYTES,
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
        self._memo = Memo(loop, cache_bytes)
        self._staging: steps.Staging | None = None  # an atomic block's saves (`_atomic.py`)

    # -- running on the saver's loop --------------------------------------------------
    async def _here(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await `coro` on the saver's loop, from whichever loop the caller runs."""
        running = asyncio.get_running_loop()
        if self._memo.loop is None:
            self._memo.loop = running
        if self._memo.loop is running:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._memo.loop))

    def _block(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the saver's loop and wait for it, from a thread outside that loop."""
        loop = self._memo.loop
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

    def _where(self, config: RunnableConfig, *, any_ns: bool = False) -> Where:
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        ns = conf.get("checkpoint_ns")
        return Where(
            self.layout.namespace(thread_id),
            thread_id,
            None if ns is None and any_ns else str(ns or ""),
            conf.get("checkpoint_id") or None,
        )

    # -- atomic blocks ----------------------------------------------------------------
    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """Every checkpoint and pending write put inside the block (a graph's, its
        subgraphs', any thread's) is committed when it ends, all of them or none, also
        across a cluster's shards (`_atomic.py`); an exception inside commits nothing.
        From sync code (`VaultSaver`, or a thread outside this saver's loop)."""
        staging = self._begin_atomic()
        try:
            yield
        finally:
            self._staging = None
        self._block(_atomic.commit(self.client, self._memo, staging.saves()))

    @contextlib.asynccontextmanager
    async def aatomic(self) -> AsyncIterator[None]:
        """`atomic` for async code: `async with saver.aatomic(): await graph.ainvoke(...)`."""
        staging = self._begin_atomic()
        try:
            yield
        finally:
            self._staging = None
        await self._here(_atomic.commit(self.client, self._memo, staging.saves()))

    def _begin_atomic(self) -> steps.Staging:
        if self._staging is not None:
            raise RuntimeError("an atomic block of this saver is open already")
        self._staging = steps.Staging()
        return self._staging

    # -- get --------------------------------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        found = self._find_blocking(self._where(config))
        return None if found is None else self._tuple(found, config)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        found = await self._here(steps.run(self._find(self._where(config)), self.client))
        return None if found is None else self._tuple(found, config)

    def _find_blocking(self, where: Where) -> Found | None:
        """A get_tuple from a thread outside the saver's loop (`VaultSaver` runs it here)."""
        return self._block(steps.run(self._find(where), self.client))

    def _find(self, where: Where) -> steps.Steps[Found | None]:
        """The checkpoint (by id, else the latest of its checkpoint_ns) and its writes:
        a listing, tag-filtered, and the files this process does not hold already."""
        cid = where.checkpoint_id
        tag = id_tag(cid) if cid else ns_tag(where.checkpoint_ns or "")
        writes: builtins.list[tuple[Ref, dict[str, Any]]] = []
        before, size = None, threads.BY_ID_PAGE if cid else threads.FIRST_PAGE
        while True:
            try:
                page = yield steps.List(where.namespace, size, before, tag)
            except NotFound:
                return None  # no such thread
            for raw in page:
                ref = Ref.of_wire(raw)
                if ref is None or ref.checkpoint_ns != where.checkpoint_ns:
                    continue
                if cid and ref.checkpoint_id != cid:
                    continue
                if ref.kind == KIND_WRITES:
                    writes.append((ref, raw))
                    continue
                mine = [
                    Record.from_wire(w) for r, w in writes if r.checkpoint_id == ref.checkpoint_id
                ]
                found: Found = yield from self._fetch(Record.from_wire(raw), ref, mine)
                return found
            if (more := threads.next_page_wire(page, size)) is None:
                return None
            before, size = more

    def _fetch(self, rec: Record, ref: Ref, writes: builtins.list[Record]) -> steps.Steps[Found]:
        """The record's files and its writes records' files: from memory when this process
        saved or read them, else downloaded side by side on the loop."""
        key = (rec.namespace, ref.checkpoint_ns, ref.checkpoint_id)
        self._memo.committed.put(key, Held.of(rec))
        names = [CHECKPOINT_FILE, *(channel_file(c) for c in rec.metadata.get("channels", {}))]
        wanted = [(rec, n) for n in names] + [(w, WRITES_FILE) for w in writes]
        blobs = [self._cached(r, n) for r, n in wanted]
        if any(b is None for b in blobs):
            blobs = yield steps.Run(partial(self._read_all, wanted))
        got = cast(builtins.list[bytes], blobs)
        files = dict(zip(names, got[: len(names)], strict=True))
        return Found(rec, files, list(zip(writes, got[len(names) :], strict=True)))

    def _cached(self, rec: Record, name: str) -> bytes | None:
        info = rec.files.get(name)
        if info is None:
            raise IntegrityError(f"record {rec.id} in {rec.namespace} has no file {name!r}")
        return self._memo.files.get(info.hash)

    async def _read_all(self, wanted: builtins.list[tuple[Record, str]]) -> builtins.list[bytes]:
        return await asyncio.gather(*(self._read(rec, name) for rec, name in wanted))

    async def _read(self, rec: Record, name: str) -> bytes:
        data = self._cached(rec, name)
        if data is None:
            digest, size = rec.files[name].hash, rec.files[name].size
            data = await self.client.read_range(rec.namespace, rec.id, name, 0, size)
            if len(data) != size or blake3.blake3(data).hexdigest() != digest:
                raise IntegrityError(f"{rec.namespace} {rec.id} {name}: bytes do not match")
            self._memo.files.put(digest, data)
        return data

    def _tuple(self, found: Found, config: RunnableConfig | None = None) -> CheckpointTuple:
        """Deserialize, in the caller: values can be large and the loop is shared."""
        md = found.record.metadata
        thread_id, ns, cid = md["thread_id"], md["checkpoint_ns"], md["checkpoint_id"]
        contents = decode(found.files[CHECKPOINT_FILE])
        if contents.checkpoint is None:
            raise IntegrityError(f"record {found.record.id} holds no checkpoint document")
        document = self.serde.loads_typed(contents.checkpoint)
        values = {
            name: self.serde.loads_typed((kind, found.files[channel_file(name)]))
            for name, kind in md.get("channels", {}).items()
        }
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
            else config_of(thread_id, ns, cid),
            checkpoint=cast(Checkpoint, {**document, "channel_values": values}),
            metadata=cast(CheckpointMetadata, md.get("metadata") or {}),
            parent_config=config_of(thread_id, ns, parent) if parent else None,
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
        put = self._encode_put(config, checkpoint, metadata, new_versions)
        self._put_blocking(put)
        return config_of(put.metadata["thread_id"], put.key[1], put.key[2])

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        put = self._encode_put(config, checkpoint, metadata, new_versions)
        await self._here(self._store_checkpoint(put))
        return config_of(put.metadata["thread_id"], put.key[1], put.key[2])

    def _put_blocking(self, put: Put) -> None:
        """A put from a thread outside the saver's loop (`VaultSaver` runs it here)."""
        self._block(self._store_checkpoint(put))

    def _encode_put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> Put:
        """Serialize the values of channels with a new version (all of them without a
        parent) and hash them, so the put can tell which ones its parent's record already
        holds; the others are the parent's and are left unserialized (`Put.unchanged`):
        a step that did not touch a long message history does not encode it."""
        where = self._where(config)
        ns = where.checkpoint_ns or ""
        cid = checkpoint["id"]
        values = checkpoint["channel_values"]
        fresh = values.keys() if where.checkpoint_id is None else values.keys() & new_versions
        typed = {k: self.serde.dumps_typed(values[k]) for k in values if k in fresh}
        md = record_metadata(KIND_CHECKPOINT, where.thread_id, ns, cid)
        md["parent_checkpoint_id"] = where.checkpoint_id
        md["channels"] = {k: kind for k, (kind, _) in typed.items()}
        # JSON on the wire, as SQLite's saver stores it: filters compare what the server's
        # record gives back, which is what json.loads made of it (no round trip here).
        md["metadata"] = get_serializable_checkpoint_metadata(config, metadata)
        document = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        return Put(
            key=(where.namespace, ns, cid),
            parent=(where.namespace, ns, where.checkpoint_id) if where.checkpoint_id else None,
            values=[Value(channel_file(k), data) for k, (_, data) in typed.items()],
            document=self.serde.dumps_typed(document),
            metadata=md,
            tags=record_tags(KIND_CHECKPOINT, ns, cid),
            unchanged={k: v for k, v in values.items() if k not in fresh},
        )

    def _values(self, channels: dict[str, Any]) -> builtins.list[tuple[str, str, bytes]]:
        """(channel, serde type, bytes) of each value (the fallback of `_save_checkpoint`)."""
        return [(name, *self.serde.dumps_typed(value)) for name, value in channels.items()]

    async def _store_checkpoint(self, put: Put) -> None:
        await steps.run(self._put_steps(put), self.client, self._staging)
        if self.keep_last is not None and self._staging is None:  # held saves inherit
            await self._prune_now_and_then(put.key[0], self.keep_last)

    def _put_steps(self, put: Put) -> steps.Steps[None]:
        """A put, for either driver (`_steps.py`): it is in flight (its writes wait) from
        the start until it ends, committed or not; once committed, its record and files
        are remembered."""
        memo = self._memo
        early = memo.begin_put(put.key)
        try:
            own = encode(Contents(early, put.document))
            parent = memo.committed.get(put.parent) if put.parent else None
            rec = yield from self._save_checkpoint(put, own, parent)
            if rec is not None:  # else held by an atomic block, remembered at its commit
                memo.committed.put(put.key, rec)
                files = [(CHECKPOINT_FILE, own), *((v.file, v.data) for v in put.values)]
                self._remember(rec, files)
        finally:
            memo.end_put(put.key)

    def _save_checkpoint(
        self, put: Put, own: bytes, parent: Held | None
    ) -> steps.Steps[Held | None]:
        """With the parent's record known: inherit its files, send what differs. Else, or
        if that record was pruned meanwhile, send every value (the vault dedups chunks)."""
        files = {CHECKPOINT_FILE: own}
        kinds = parent.channels if parent is not None else {}
        if parent is not None and all(
            channel_file(k) in parent.files and k in kinds for k in put.unchanged
        ):
            put.metadata["channels"].update({k: kinds[k] for k in put.unchanged})
            held = parent.files
            files.update({v.file: v.data for v in put.values if _differs(held.get(v.file), v)})
            inheriting = SaveOptions(
                parent=parent.id,
                inherit=True,
                metadata=put.metadata,
                tags=tuple(put.tags),
                chunking=CHUNKING,
            )
            try:
                answer = yield steps.Save(put.key[0], files, inheriting, answer="json", key=put.key)
            except (NotFound, Conflict):
                pass  # the parent's record is gone: fall through and send everything
            else:
                return None if answer is None else Held.of(answer)
        values = yield steps.Offload(partial(self._values, put.unchanged))
        for name, kind, data in values:
            files[channel_file(name)] = data
            put.metadata["channels"][name] = kind
        files.update({v.file: v.data for v in put.values})
        whole = SaveOptions(metadata=put.metadata, tags=tuple(put.tags), chunking=CHUNKING)
        answer = yield steps.Save(put.key[0], files, whole, answer="json", key=put.key)
        return None if answer is None else Held.of(answer)

    # -- put_writes -------------------------------------------------------------------
    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._writes_blocking(self._encode_writes(config, writes, task_id, task_path))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        req = self._encode_writes(config, writes, task_id, task_path)
        await self._here(steps.run(self._writes_steps(req), self.client, self._staging))

    def _writes_blocking(self, req: Writes) -> None:
        """A put_writes from a thread outside the saver's loop (`VaultSaver` runs it here)."""
        self._block(steps.run(self._writes_steps(req), self.client, self._staging))

    def _encode_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> Writes:
        where = self._where(config)
        ns, cid = where.checkpoint_ns or "", str(where.checkpoint_id)
        dumps = self.serde.dumps_typed
        stored = [
            StoredWrite(task_id, task_path, ch, WRITES_IDX_MAP.get(ch, i), dumps(v))
            for i, (ch, v) in enumerate(writes)
        ]
        md = record_metadata(KIND_WRITES, where.thread_id, ns, cid)
        md["task_id"] = task_id
        return Writes((where.namespace, ns, cid), stored, md, record_tags(KIND_WRITES, ns, cid))

    def _writes_steps(self, req: Writes) -> steps.Steps[None]:
        """A writes record, committed after its checkpoint's put when that is on its way;
        if that put has not started, it carries these writes too (`Memo.before_writes`).
        Its file is remembered, so reading the checkpoint back downloads nothing; the
        record the vault answers is not read (nothing of it is needed)."""
        pending = self._memo.before_writes(req.key, req.writes)
        if pending is not None:
            yield steps.Wait(pending)  # commit after the checkpoint, never before it
        data = encode(Contents(writes=req.writes))
        yield steps.Save(
            req.key[0],
            {WRITES_FILE: data},
            SaveOptions(metadata=req.metadata, tags=tuple(req.tags), chunking=CHUNKING),
            answer="nothing",  # nothing of the record is used: it need not be read
        )
        self._memo.files.put(blake3.blake3(data).hexdigest(), data)  # a few hundred bytes

    def _remember(self, rec: Held, files: builtins.list[tuple[str, bytes]]) -> None:
        """Keep files this process saved under the hashes the vault answered for them."""
        for name, data in files:
            hash_size = rec.files.get(name)
            if hash_size is not None and hash_size[1] == len(data):
                self._memo.files.put(hash_size[0], data)

    # -- whole threads ----------------------------------------------------------------
    def delete_thread(self, thread_id: str) -> None:
        self._block(threads.delete_thread(self.client, self.layout.namespace(str(thread_id))))

    async def adelete_thread(self, thread_id: str) -> None:
        ns = self.layout.namespace(str(thread_id))
        await self._here(threads.delete_thread(self.client, ns))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._block(threads.delete_for_runs(self.client, self.layout, {str(r) for r in run_ids}))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = {str(r) for r in run_ids}
        await self._here(threads.delete_for_runs(self.client, self.layout, runs))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._block(self._copy(str(source_thread_id), str(target_thread_id)))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._here(self._copy(str(source_thread_id), str(target_thread_id)))

    async def _copy(self, source: str, target: str) -> None:
        src, dst = self.layout.namespace(source), self.layout.namespace(target)
        await threads.copy_thread(self.client, src, dst, target)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._block(self._prune([str(t) for t in thread_ids], strategy))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._here(self._prune([str(t) for t in thread_ids], strategy))

    async def _prune(self, thread_ids: builtins.list[str], strategy: str) -> None:
        """`keep_latest`: the newest checkpoint of each checkpoint_ns stays (with the
        ancestors a DeltaChannel needs, see `_retention.py`); `delete`: the whole thread."""
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}: keep_latest or delete")
        for thread_id in thread_ids:
            ns = self.layout.namespace(thread_id)
            if strategy == "delete":
                await threads.delete_thread(self.client, ns)
            else:
                await threads.prune(self.client, ns, 1)

    async def _prune_now_and_then(self, namespace: str, keep: int) -> None:
        """Prune a thread every ~keep/4 puts, inside the put that crosses the mark: a thread
        then holds at most ~1.25 x keep checkpoints per checkpoint_ns, and the listing is
        paid once per keep/4 puts rather than on every put."""
        if not self._memo.prune_due(namespace, max(1, keep // 4)):
            return
        try:
            await threads.prune(self.client, namespace, keep)
        finally:
            self._memo.pruned(namespace)

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
            while (found := await self._here(next_found(scan))) is not None:
                yield self._tuple(found)
        finally:
            await self._here(close(scan))

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
            while (found := self._block(next_found(scan))) is not None:
                yield self._tuple(found)
        finally:
            self._block(close(scan))

    async def _scan(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> AsyncGenerator[Found, None]:
        """Checkpoints newest first per thread, with their writes (met before them)."""
        where = self._where(config, any_ns=True) if config else None
        if where:
            namespaces = [where.namespace]
        else:
            namespaces = await threads.thread_namespaces(self.client, self.layout)
        before_id = (before or {}).get("configurable", {}).get("checkpoint_id")
        tag = None
        if where and where.checkpoint_id:
            tag = id_tag(where.checkpoint_id)
        elif where and where.checkpoint_ns is not None:
            tag = ns_tag(where.checkpoint_ns)
        left = limit
        if left is not None and left <= 0:
            return
        for namespace in namespaces:
            writes: dict[tuple[str, str], builtins.list[Record]] = {}
            listing = threads.records(self.client, namespace, tag=tag, first=threads.PAGE)
            async with aclosing(listing) as found:
                async for rec in found:
                    ref = Ref.of(rec)
                    if ref is None:
                        continue
                    key = (ref.checkpoint_ns, ref.checkpoint_id)
                    if ref.kind == KIND_WRITES:
                        writes.setdefault(key, []).append(rec)
                        continue
                    mine = writes.pop(key, [])
                    if not wanted(rec, ref, where, before_id, filter):
                        continue
                    yield await steps.run(self._fetch(rec, ref, mine), self.client)
                    if left is not None:
                        left -= 1
                        if left <= 0:
                            return
