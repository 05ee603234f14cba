"""Saves a worker prepared, committed by the process that writes: a lean local channel.

An agent's one-request save is mostly CPU outside the writer: the HTTP request, auth, the
bundle, cutting, hashing, compressing and the JSON answer. A worker does all of that itself
(api/workers.py) and hands the writing process only the prepared saves
(`SaveBatch` of `vault.PreparedSave`: one for a one-request save, all of a `POST
/v1/saves`) on this socket (`Settings.calls_socket`, mode 0600 in the data dir);
the writing process queues them on its writer straight from its event loop (no thread
hop, no HTTP parsing; one writer batch takes them) and answers with each checkpoint once
the last is durable. Forwarding the save
as HTTP instead would have the writing process pay for the whole request again.

Frames both ways: a 12-byte head (payload length u32, call id u64, big endian) and a
pickle. Many calls share one connection per worker, answered as they complete. The same
connection carries the worker's tokens' last uses, and the other way, with call ids that
have the top bit set, the writing process's questions (a worker's metrics, for a
`/metrics` that counts every process's requests). Pickle is safe here because both
ends are this service: the socket is the server user's alone. A worker whose connection
breaks fails the calls under way with 503 `unavailable`; the client's retry carries the
same idempotency key, so a save committed before the break is returned, not made twice.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from vault import PreparedSave, StoredCheckpoint, Unavailable, Vault

log = logging.getLogger("ckpt.api")

_HEAD = struct.Struct(">IQ")
MAX_FRAME = 1 << 30
# Bytes a reader of the channel buffers before it stops reading the socket. At asyncio's
# 64 KiB a frame of a few 40 kB saves paused and resumed the socket's reading each time
# (two epoll changes per frame, ~10% of the writing loop's samples); frames come from our
# own workers, whose requests are bounded by max_batch_body.
CHANNEL_BUFFER = 8 << 20
CONNECT_WAIT, CONNECT_RETRY = 10.0, 0.05  # seconds
ASKED = 1 << 63  # call ids of the writing process's questions to a worker (the other way)
ASK_WAIT = 5.0  # seconds a worker has to answer one
METRICS_PLEASE = "metrics"

Saved = tuple[StoredCheckpoint, bool]


def _answer(ok: bool, value: object) -> bytes:
    try:
        return pickle.dumps((ok, value), protocol=5)
    except Exception as e:  # noqa: BLE001 - an error that does not pickle still answers
        return pickle.dumps((False, Unavailable(f"{type(value).__name__}: {value} ({e})")))


async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    length, call = _HEAD.unpack(await reader.readexactly(_HEAD.size))
    if length > MAX_FRAME:
        raise ValueError(f"a frame of {length} bytes")
    return call, await reader.readexactly(length)


@dataclass(frozen=True)
class SaveBatch:
    """The prepared saves of one request on a worker (one, or all of a `POST /v1/saves`)
    in one frame: committed in one writer batch and answered in one frame, an (ok, value)
    per save, in order."""

    saves: list[PreparedSave]


@dataclass(frozen=True)
class TokenUses:
    """When a worker last saw each token (by key id): the writing process keeps them with
    its own and stores them when it stores those (`TokenCache.take_uses`)."""

    last_used: dict[str, float]


class CallServer:
    """The writing process's end: commits the prepared saves its workers send and takes
    their tokens' last uses (`note_uses`: its own `TokenCache.note_uses`)."""

    def __init__(self, vault: Vault, note_uses: Callable[[dict[str, float]], None]) -> None:
        self._vault = vault
        self._note_uses = note_uses
        self._connections: set[asyncio.StreamWriter] = set()
        self._asked: dict[int, asyncio.Future[Any]] = {}  # our questions to the workers
        self._ids = itertools.count(1)

    async def worker_metrics(self) -> list[str]:
        """Each connected worker's metrics, in Prometheus text (its request counters are
        its own; `/metrics` sums them with this process's, api/observability.py)."""
        loop = asyncio.get_running_loop()
        asked = []
        for writer in list(self._connections):
            call = ASKED | next(self._ids)
            self._asked[call] = answer = loop.create_future()
            _send(writer, call, pickle.dumps(METRICS_PLEASE))
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

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        try:
            while True:
                try:
                    call, payload = await _read_frame(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                if call & ASKED:  # a worker answering our question
                    answer = self._asked.get(call)
                    if answer is not None and not answer.done():
                        answer.set_result(pickle.loads(payload))  # noqa: S301 - our worker
                    continue
                self._commit(writer, call, payload)
        except ValueError as e:
            log.error("engine calls: closing a connection that sent %s", e)
        finally:
            self._connections.discard(writer)
            writer.close()

    def _commit(self, writer: asyncio.StreamWriter, call: int, payload: bytes) -> None:
        try:
            message = pickle.loads(payload)  # noqa: S301 - our own worker, our own socket
            if isinstance(message, TokenUses):
                self._note_uses(message.last_used)
                _send(writer, call, _answer(True, None))
                return
            if not isinstance(message, SaveBatch):
                raise TypeError(f"expected prepared saves, got {type(message).__name__}")
        except Exception as e:  # noqa: BLE001 - the caller gets it as its answer
            _send(writer, call, _answer(False, e))
            return
        self._commit_all(writer, call, message.saves)

    def _commit_all(
        self, writer: asyncio.StreamWriter, call: int, saves: list[PreparedSave]
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
        left = [len(futures)]
        lock = threading.Lock()  # the syncer resolves them on its own thread

        def one_done(_: Future[Saved]) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                loop.call_soon_threadsafe(_reply_all, writer, call, futures)

        for future in futures:
            future.add_done_callback(one_done)


def _reply_all(writer: asyncio.StreamWriter, call: int, done: list[Future[Saved]]) -> None:
    outcomes = [
        (False, e) if (e := f.exception()) is not None else (True, f.result()) for f in done
    ]
    _send(writer, call, _answer(True, outcomes))


def _error(value: object) -> Exception:
    return value if isinstance(value, Exception) else Unavailable(f"{value!r}")


def _send(writer: asyncio.StreamWriter, call: int, payload: bytes) -> None:
    if not writer.is_closing():
        writer.write(_HEAD.pack(len(payload), call) + payload)


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
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count(1)
        self._connecting = asyncio.Lock()

    async def save(self, prepared: PreparedSave) -> Saved:
        """What the writing process's writer made of `prepared`: (record, created)."""
        (outcome,) = await self.save_all([prepared])
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def save_all(self, prepared: list[PreparedSave]) -> list[Saved | Exception]:
        """What the writer made of each of `prepared` (one frame each way): (record,
        created), or the error that save met."""
        outcomes: list[tuple[bool, Any]] = await self._call(
            pickle.dumps(SaveBatch(prepared), protocol=5)
        )
        return [value if ok else _error(value) for ok, value in outcomes]

    async def note_uses(self, last_used: dict[str, float]) -> None:
        """Hand the writing process when this worker last saw each token."""
        await self._call(pickle.dumps(TokenUses(last_used), protocol=5))

    async def _call(self, payload: bytes) -> Any:
        writer = await self._connected()
        call = next(self._ids)
        answer: asyncio.Future[Any] = self._loop.create_future()
        self._pending[call] = answer
        writer.write(_HEAD.pack(len(payload), call) + payload)
        await writer.drain()
        ok, value = await answer
        if not ok:
            raise value
        return value

    async def _connected(self) -> asyncio.StreamWriter:
        async with self._connecting:
            if self._writer is not None and not self._writer.is_closing():
                return self._writer
            deadline = time.monotonic() + CONNECT_WAIT
            while True:
                try:
                    reader, writer = await asyncio.open_unix_connection(
                        self._path, limit=CHANNEL_BUFFER
                    )
                    break
                except OSError as e:
                    if time.monotonic() > deadline:
                        raise Unavailable(
                            f"the server process that writes is not reachable ({e}); retry"
                        ) from None
                    await asyncio.sleep(CONNECT_RETRY)
            self._writer = writer
            self._loop.create_task(self._answers(reader, writer))
            return writer

    async def _answers(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                call, payload = await _read_frame(reader)
                if call & ASKED:  # the writing process asks (its /metrics)
                    _send(writer, call, pickle.dumps(self._metrics()))
                    continue
                answer = self._pending.pop(call, None)
                if answer is not None and not answer.done():
                    answer.set_result(pickle.loads(payload))  # noqa: S301 - our own server
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
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
