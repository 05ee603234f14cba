"""Saves a worker prepared, committed by the process that writes: a lean local channel.

An agent's one-request save is mostly CPU outside the writer: the HTTP request, auth, the
bundle, cutting, hashing, compressing and the JSON answer. A worker does all of that itself
(node/supervisor.py) and hands the writing process only the prepared saves (`vault.PreparedSave`:
one for a one-request save, all of a `POST /v1/saves`) on this socket
(`Settings.calls_socket`, mode 0600 in the data dir); the writing process queues them on
its writer straight from its event loop (no thread hop, no HTTP parsing; one writer batch
takes them) and answers with each checkpoint once the last is durable. Forwarding the save
as HTTP instead would have the writing process pay for the whole request again.

The messages are node/channel.py's named kinds, encoded here field by field: a save's
request fields as JSON, its files, entries and new frames as raw blobs; a checkpoint as its
catalog JSON (without its files when they are the ones the worker sent: it has them); an
error as its stable code, class name and message, raised again on the worker as the
engine's class of that code (`VaultError` subclasses only: nothing a peer
sends picks a class outside that tree or runs code). Many calls share one connection per
worker, answered as they complete; the same connection carries the worker's tokens' last
uses and, the other way, the writing process's questions (a worker's metrics, for a
`/metrics` that counts every process's requests). The writing process accepts a
connection only from one of its current workers (SO_PEERCRED, node/peercred.py); a frame
that does not decode closes the connection with one log line. A worker whose connection
breaks fails the calls under way with 503 `unavailable`; the client's retry carries the
same idempotency key, so a save committed before the break is returned, not made twice.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from functools import lru_cache
from typing import Any, TypedDict

from checkpoint_vault.vault import (
    FileEntry,
    PreparedSave,
    StoredCheckpoint,
    Unavailable,
    Vault,
    VaultError,
)
from checkpoint_vault.vault.chunking import ChunkingProfile
from checkpoint_vault.vault.direct import SaveRequest

from .channel import TO_WORKER, TO_WRITER, ChannelError, Kind, Message, encode, take, want

log = logging.getLogger("ckpt.api")

# Bytes a reader of the channel buffers before it stops reading the socket. At asyncio's
# 64 KiB a frame of a few 40 kB saves paused and resumed the socket's reading each time
# (two epoll changes per frame, ~10% of the writing loop's samples); frames come from our
# own workers, whose requests are bounded by max_batch_body.
CHANNEL_BUFFER = 8 << 20
CONNECT_WAIT, CONNECT_RETRY = 10.0, 0.05  # seconds
ASK_WAIT = 5.0  # seconds a worker has to answer the writing process's question
CHUNK_ID = 32  # bytes of a chunk id (BLAKE3)

Saved = tuple[StoredCheckpoint, bool]
Outcome = Saved | Exception


def saves_message(call: int, saves: Sequence[PreparedSave]) -> Message:
    """SAVES: each save's request fields in the JSON; per save, its files, its entries,
    its new frames' ids (one blob) and those frames, in that order, as blobs."""
    described: list[dict[str, Any]] = []
    blobs: list[bytes | memoryview] = []
    for p in saves:
        s = p.request
        described.append(
            {
                "ns": s.ns,
                "parent": s.parent,
                "inherit": s.inherit,
                "metadata": s.metadata,
                "tags": s.tags,
                "key": s.key,
                "by": s.by,
                "profile": vars(s.profile),
                "files": list(s.files),
                "entries": list(p.entries),
                "frames": len(p.frames),
                "patch_here": {c.hex(): b.hex() for c, b in p.patch_here.items()},
            }
        )
        blobs += s.files.values()
        blobs += (entry.to_bytes() for entry in p.entries.values())
        blobs.append(b"".join(p.frames))
        blobs += p.frames.values()
    return Message(Kind.SAVES, call, {"saves": described}, blobs)


def prepared_saves(message: Message) -> list[PreparedSave]:
    """The prepared saves of a SAVES message; ChannelError if it is not one `saves_message`
    makes."""
    blobs = iter(message.blobs)
    saves = [_prepared(d, blobs) for d in _dicts(message)]
    if next(blobs, None) is not None:
        raise ChannelError("a save batch with parts left over")
    return saves


def _dicts(message: Message) -> list[dict[str, Any]]:
    described: list[dict[str, Any]] = want(message.fields, "saves", list)
    if not all(isinstance(d, dict) for d in described):
        raise ChannelError("a save batch whose saves are not JSON objects")
    return described


def _prepared(d: dict[str, Any], blobs: Iterator[memoryview | bytes]) -> PreparedSave:
    names, entry_names = want(d, "files", list), want(d, "entries", list)
    if not all(isinstance(n, str) for n in [*names, *entry_names]):
        raise ChannelError("a save whose file names are not strings")
    try:
        files = {name: bytes(next(blobs)) for name in names}
        entries = {name: _entry(next(blobs)) for name in entry_names}
        ids, frames = next(blobs), int(want(d, "frames", int))
        if len(ids) != frames * CHUNK_ID:
            raise ChannelError(f"a save with {len(ids)} bytes of ids for {frames} frames")
        cids = [bytes(ids[i : i + CHUNK_ID]) for i in range(0, len(ids), CHUNK_ID)]
        new = {cid: bytes(next(blobs)) for cid in cids}
    except StopIteration:
        raise ChannelError("a save batch missing parts") from None
    tags = want(d, "tags", list)
    if tags and not all(type(t) is str for t in tags):
        raise ChannelError("a save whose tags are not strings")
    request = SaveRequest(
        want(d, "ns", str),
        files,
        want(d, "parent", str, type(None)),
        want(d, "inherit", bool),
        want(d, "metadata", dict),
        tags,
        want(d, "key", str, type(None)),
        want(d, "by", str, type(None)),
        _profile(want(d, "profile", dict)),
    )
    return PreparedSave(request, entries, new, _patch_here(d, entries))


def _patch_here(d: dict[str, Any], entries: Mapping[str, FileEntry]) -> dict[bytes, bytes]:
    """The small files whose frames the writer makes (vault/smallfile.py): each one of
    this save's one-chunk files, with the id of its base."""
    pairs = want(d, "patch_here", dict)
    ones = {e.chunks[0][0] for e in entries.values() if len(e.chunks) == 1}
    try:
        out = {bytes.fromhex(c): bytes.fromhex(b) for c, b in pairs.items()}
    except (TypeError, ValueError):
        raise ChannelError("a save whose patch_here is not ids in hex") from None
    if not all(c in ones and len(b) == CHUNK_ID for c, b in out.items()):
        raise ChannelError("a save whose patch_here names other chunks")
    return out


def _entry(blob: bytes | memoryview) -> FileEntry:
    try:  # kept in the form it came in: the writer needs it three times (`from_bytes`)
        return FileEntry.from_bytes(bytes(blob))
    except (struct.error, ValueError) as e:
        raise ChannelError(f"a save with a malformed file entry ({e})") from None


def _profile(fields: dict[str, Any]) -> ChunkingProfile:
    sizes = ("min_size", "avg_size", "max_size", "tensor_pieces")
    if type(fields.get("name")) is not str or not all(type(fields.get(n)) is int for n in sizes):
        raise ChannelError("a save with a malformed chunking profile")
    if len(fields) != 1 + len(sizes):
        raise ChannelError("a save whose chunking profile has other fields")
    return _profile_of(fields["name"], *(fields[n] for n in sizes))


@lru_cache(maxsize=64)
def _profile_of(name: str, *sizes: int) -> ChunkingProfile:
    """Profiles are few and frozen: one object each, as `vault.direct` keeps their fields."""
    return ChunkingProfile(name, *sizes)


def saved_message(call: int, outcomes: Sequence[Outcome], saves: Sequence[PreparedSave]) -> Message:
    """SAVED: per save `{"created": bool}` with its record's catalog JSON as the next blob,
    or `{"error": ...}`. A checkpoint the save created with exactly the files it sent
    (`"elided": true`) comes without them: the worker has their entries (`outcomes_of`),
    and they are most of the record's JSON."""
    described: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for outcome, prepared in zip(outcomes, saves, strict=True):
        if isinstance(outcome, Exception):
            described.append({"error": error_fields(outcome)})
            continue
        record, created = outcome
        elided = created and not prepared.request.inherit
        described.append({"created": created, "elided": True} if elided else {"created": created})
        blobs.append(record.to_json(with_files=not elided))
    return Message(Kind.SAVED, call, {"outcomes": described}, blobs)


def outcomes_of(message: Message, saves: Sequence[PreparedSave]) -> list[Outcome]:
    """Each save's outcome in a SAVED answer to `saves`."""
    described = want(message.fields, "outcomes", list)
    if len(described) != len(saves):
        raise ChannelError(f"{len(described)} outcomes for {len(saves)} saves")
    blobs = iter(message.blobs)
    outcomes: list[Outcome] = []
    for d, prepared in zip(described, saves, strict=True):
        if not isinstance(d, dict):
            raise ChannelError("an outcome that is not a JSON object")
        if "error" in d:
            outcomes.append(error_of(want(d, "error", dict)))
            continue
        blob = next(blobs, None)
        if blob is None:
            raise ChannelError("a save's outcome without its record")
        try:
            record = StoredCheckpoint.from_json(blob)
        except (ValueError, TypeError, KeyError) as e:
            raise ChannelError(f"a malformed checkpoint record ({e})") from None
        if d.get("elided") is True:  # the files this save sent, as the catalog made them
            record.set_files(prepared.entries)
        outcomes.append((record, want(d, "created", bool)))
    return outcomes


class WireError(TypedDict):
    """An error on the channel: the engine's stable code, its class's name (one of that
    code's), its message, and its plain attributes."""

    code: str
    type: str
    message: str
    attrs: dict[str, object]


def error_fields(e: Exception) -> WireError:
    """An error as its stable code, class name, message and plain attributes (a
    `MissingChunks`'s list); anything not a `VaultError` is a bug, logged here."""
    if not isinstance(e, VaultError):
        log.error("a worker's call failed in the writing process", exc_info=e)
        return {"code": "internal", "type": "VaultError", "message": type(e).__name__, "attrs": {}}
    attrs = {k: v for k, v in vars(e).items() if not k.startswith("_") and k != "message"}
    try:
        json.dumps(attrs)
    except (TypeError, ValueError):
        attrs = {}
    return {"code": e.code, "type": type(e).__name__, "message": e.message, "attrs": attrs}


def error_of(fields: Mapping[str, Any]) -> VaultError:
    """The engine's error `error_fields` described: the class of that name among those of
    that code, else the most general class of the code, else a plain `VaultError`."""
    code, name = want(fields, "code", str), want(fields, "type", str)
    message = want(fields, "message", str)
    attrs = fields.get("attrs") or {}
    if not isinstance(attrs, dict):
        raise ChannelError("an error whose attributes are not a JSON object")
    error = (VaultError.of_code(code, name) or VaultError).rebuilt(message)
    for key, value in attrs.items():
        if key.isidentifier() and not key.startswith("_") and key not in ("code", "status"):
            setattr(error, key, value)
    return error


class CallServer:
    """The writing process's end: commits the prepared saves its workers send and takes
    their tokens' last uses (`note_uses`: its own `TokenCache.note_uses`). Each worker's
    connection is a `_Calls` protocol (`connection`)."""

    def __init__(self, vault: Vault, note_uses: Callable[[dict[str, float]], None]) -> None:
        self._vault = vault
        self._note_uses = note_uses
        self._connections: set[asyncio.Transport] = set()
        self._asked: dict[int, asyncio.Future[str]] = {}  # our questions to the workers
        self._ids = itertools.count(1)

    def connection(self) -> asyncio.Protocol:
        """A new worker connection's protocol (`loop.create_unix_server`)."""
        return _Calls(self._take, self._connections)

    async def worker_metrics(self) -> list[str]:
        """Each connected worker's metrics, in Prometheus text (its request counters are
        its own; `/metrics` sums them with this process's, api/observability.py)."""
        loop = asyncio.get_running_loop()
        asked = []
        for transport in list(self._connections):
            call = next(self._ids)
            self._asked[call] = answer = loop.create_future()
            _send(transport, Message(Kind.METRICS_ASK, call))
            asked.append((call, answer))
        texts = []
        for call, answer in asked:
            try:
                texts.append(await asyncio.wait_for(answer, ASK_WAIT))
            except asyncio.TimeoutError:
                log.warning("a worker did not answer for its metrics in %.0f s", ASK_WAIT)
            finally:
                self._asked.pop(call, None)
        return texts

    def _take(self, transport: asyncio.Transport, message: Message) -> None:
        if message.kind == Kind.METRICS:  # a worker answering our question
            answer = self._asked.get(message.call)
            if answer is not None and not answer.done() and message.blobs:
                answer.set_result(bytes(message.blobs[0]).decode(errors="replace"))
            return
        if message.kind == Kind.USES:
            uses = want(message.fields, "last_used", dict)
            if not all(isinstance(v, float | int) for v in uses.values()):
                raise ChannelError("token uses that are not times")
            self._note_uses(uses)
            _send(transport, Message(Kind.NOTED, message.call))
            return
        self._commit_all(transport, message.call, prepared_saves(message))

    def _commit_all(
        self, transport: asyncio.Transport, call: int, saves: list[PreparedSave]
    ) -> None:
        """Queue every save of a batch at once (one writer batch takes them); answer once
        the last is durable, with each one's outcome."""
        loop = asyncio.get_running_loop()
        futures: list[Future[Saved]] = []
        for prepared in saves:
            try:
                futures.append(self._vault.commit_prepared(prepared))
            except Exception as e:  # noqa: BLE001 - that save's answer
                failed: Future[Saved] = Future()
                failed.set_exception(e)
                futures.append(failed)
        if not futures:
            _send(transport, saved_message(call, [], []))
            return
        left = [len(futures)]
        lock = threading.Lock()  # the syncer resolves them on its own thread

        def one_done(_: Future[Saved]) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                loop.call_soon_threadsafe(_reply_all, transport, call, futures, saves)

        for future in futures:
            future.add_done_callback(one_done)


class _Calls(asyncio.Protocol):
    """A worker's connection, on the writing process: each frame taken apart as its last
    byte arrives (`take`) and handled from the transport's callback, as the worker's end
    reads its answers (`_Frames`): a reader task woken for each save cost this process's
    loop a pass, two `readexactly` and a coroutine resumed. Nothing here waits to write:
    answers are small, and a worker reads them as they come."""

    def __init__(
        self,
        handle: Callable[[asyncio.Transport, Message], None],
        connections: set[asyncio.Transport],
    ) -> None:
        """`handle` each message; `connections`: the open ones, this one while it is."""
        self._handle = handle
        self._connections = connections
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._connections.add(transport)

    def data_received(self, data: bytes) -> None:
        transport = self._transport
        assert transport is not None
        self._buffer += data
        try:
            for message in take(self._buffer, TO_WRITER):
                self._handle(transport, message)
        except ChannelError as e:
            log.error("engine calls: closing a connection that sent %s", e)
            self._buffer.clear()
            transport.close()  # nothing after a bad frame is aligned

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._connections.discard(self._transport)


def _reply_all(
    transport: asyncio.Transport, call: int, done: list[Future[Saved]], saves: list[PreparedSave]
) -> None:
    outcomes: list[Outcome] = [
        e if (e := f.exception()) is not None and isinstance(e, Exception) else f.result()
        for f in done
    ]
    _send(transport, saved_message(call, outcomes, saves))


def _send(transport: asyncio.WriteTransport | asyncio.StreamWriter, message: Message) -> None:
    if not transport.is_closing():
        transport.write(encode(message))


class _Frames(asyncio.StreamReaderProtocol):
    """A worker's end of its connection, reading: each frame taken apart as its last byte
    arrives and handed on (`take`) from the transport's callback. A reader task woken for
    each answer cost the worker one more pass of its event loop per save (a readable
    socket, then the task, then the handler). Writing, and waiting while the writing
    process reads slower (drain), stay the stream's."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.reader = asyncio.StreamReader(limit=CHANNEL_BUFFER, loop=loop)
        super().__init__(self.reader, loop=loop)
        self._buffer = bytearray()
        self._take: Callable[[Message], None] = lambda _: None
        self._lost: Callable[[], None] = lambda: None

    def bind(self, take: Callable[[Message], None], lost: Callable[[], None]) -> None:
        """`take` each message; `lost`: the connection ended (or sent what is no frame)."""
        self._take, self._lost = take, lost

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        try:
            for message in take(self._buffer, TO_WORKER):
                self._take(message)
        except ChannelError as e:
            log.error("engine calls: the writing process sent %s; reconnecting", e)
            self._buffer.clear()
            self._end()  # closes the connection: nothing after a bad frame is aligned

    def eof_received(self) -> bool:
        return False  # the writing process closed its end: close ours (`connection_lost`)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._end()

    def _end(self) -> None:
        """`lost`, once: by then another connection may have calls of its own under way."""
        lost, self._lost = self._lost, lambda: None
        self._take = lambda _: None
        lost()


class CallClient:
    """A worker's end: one connection to the writing process, opened at start and again
    after it broke; used from the worker's event loop."""

    def __init__(
        self, path: str, loop: asyncio.AbstractEventLoop, metrics: Callable[[], str]
    ) -> None:
        """`metrics`: this worker's metrics in Prometheus text, for the writing process."""
        self._path = path
        self._loop = loop
        self._metrics = metrics
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future[Message]] = {}
        self._ids = itertools.count(1)
        self._connecting = asyncio.Lock()

    async def save(self, prepared: PreparedSave) -> Saved:
        """What the writing process's writer made of `prepared`: (record, created)."""
        (outcome,) = await self.save_all([prepared])
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def save_all(self, prepared: list[PreparedSave]) -> list[Outcome]:
        """What the writer made of each of `prepared` (one frame each way): (record,
        created), or the error that save met."""
        answer = await self._call(lambda call: saves_message(call, prepared), Kind.SAVED)
        try:
            return outcomes_of(answer, prepared)
        except ChannelError as e:
            log.error("engine calls: the writing process answered %s", e)
            raise Unavailable("the server process that writes answered wrong; retry") from None

    async def note_uses(self, last_used: dict[str, float]) -> None:
        """Hand the writing process when this worker last saw each token."""
        await self._call(
            lambda call: Message(Kind.USES, call, {"last_used": last_used}), Kind.NOTED
        )

    async def _call(self, message: Callable[[int], Message], expected: Kind) -> Message:
        writer = await self._connected()
        call = next(self._ids)
        answer: asyncio.Future[Message] = self._loop.create_future()
        self._pending[call] = answer
        writer.write(encode(message(call)))
        await writer.drain()
        reply = await answer
        if reply.kind == Kind.FAILED:
            raise error_of(want(reply.fields, "error", dict))
        if reply.kind != expected:
            raise Unavailable(f"the server process that writes answered {reply.kind.name}; retry")
        return reply

    async def _connected(self) -> asyncio.StreamWriter:
        writer = self._writer
        if writer is not None and not writer.is_closing():
            return writer  # the usual case, without the lock's acquire and release
        async with self._connecting:
            if self._writer is not None and not self._writer.is_closing():
                return self._writer
            deadline = time.monotonic() + CONNECT_WAIT
            while True:
                try:
                    transport, frames = await self._loop.create_unix_connection(
                        lambda: _Frames(self._loop), self._path
                    )
                    break
                except OSError as e:
                    if time.monotonic() > deadline:
                        raise Unavailable(
                            f"the server process that writes is not reachable ({e}); retry"
                        ) from None
                    await asyncio.sleep(CONNECT_RETRY)
            writer = asyncio.StreamWriter(transport, frames, frames.reader, self._loop)
            frames.bind(
                functools.partial(self._take, writer), functools.partial(self._lost, writer)
            )
            self._writer = writer
            return writer

    def _take(self, writer: asyncio.StreamWriter, message: Message) -> None:
        if message.kind == Kind.METRICS_ASK:  # the writing process asks (its /metrics)
            text = self._metrics().encode()
            _send(writer, Message(Kind.METRICS, message.call, blobs=[text]))
            return
        answer = self._pending.pop(message.call, None)
        if answer is not None and not answer.done():
            answer.set_result(message)

    def _lost(self, writer: asyncio.StreamWriter) -> None:
        writer.close()
        if self._writer is writer:
            self._writer = None
        pending, self._pending = self._pending, {}
        for answer in pending.values():
            if not answer.done():
                answer.set_exception(
                    Unavailable("the server process that writes went away; retry the save")
                )

    async def connect(self) -> None:
        """Connect now (the writing process asks connected workers for their metrics)."""
        await self._connected()

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
