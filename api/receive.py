"""Receiving a large request body on a thread, straight into the buffer it is kept in.

Through aiohttp a chunk batch reached the handler as ~256 KiB socket reads, each parsed,
queued and handed over by the event loop, then joined into one buffer: ~0.5 s of the loop's
CPU per GB, on the thread that also answers every other request. Here the loop only starts
the body: a receiver thread takes the rest with `recv_into` on its own descriptor of the
socket (a dup, as the download senders do), waiting in `poll` when nothing has arrived.

aiohttp's parser then never sees those bytes and still expects them, so the connection
cannot carry another request: it is closed once the answer is sent (the client opens a
new one, ~0.1 ms on loopback against the ~10 ms a 16 MiB body takes). TLS bodies, bodies
without a Content-Length and small ones go the usual way.

Receiver and hand-over threads are shared by every tenant, so each token may hold only its
share of them (`receivers_per_token`, `handovers_per_token`; api/bodies.py `Shares`): past
it, its next body is answered 429 with Retry-After, and the other tokens' bodies find the
rest of the pool free. A body on a receiver must also keep a minimum rate: it has
body_timeout plus its length at `body_min_rate` in all, or 408, however often a byte comes.

A file handed over by descriptor on the local socket (client/local.py) is received the
same way, and must be: aiohttp reads with `recv`, which would drop the descriptor. The
client sends it only after `100 Continue`, which goes out once the socket is taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import socket
import stat
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy
from aiohttp import HttpVersion11, web

from checkpoint_vault.protocol import CONTINUE, DESCRIPTOR_TYPE
from checkpoint_vault.vault import InvalidRequest, TooLarge

from .auth import principal
from .errors import BodyTimeout, RequestTimeout
from .http import read_writable_body, reading_body
from .keys import BODY_READERS, RUNTIME, SETTINGS
from .ratelimit import RateLimited
from .transfer.bodies import Shares

THREAD_MIN = 1 << 20  # smaller bodies: the handover costs more than the loop's reads
T = TypeVar("T")
_TAKEN = web.RequestKey("body_taken", bool)  # its connection ends with its answer
SHARE_RETRY_AFTER = 1  # seconds a token past its share is told to wait: a body's time
# The most a hand-over job reads or writes between two looks at its `stop` (vault/ingest.py
# DESCRIPTOR_PIECE; a restore's batches are smaller): a piece's time at body_min_rate is
# part of how long a job may go without one.
HANDOVER_PIECE = 8 << 20
# Seconds a stopped hand-over job is given to notice its stop before the answer goes out
# without it: one still running then is stuck in the kernel (or mid-piece, and ends there).
STOP_GRACE = 1.0


class _Held:
    """One thread of a pool counted against a token, given back once: when the thread's
    work is done (a cancelled handler's receiver still runs until woken), or at `done` if
    no work was ever started."""

    def __init__(self, shares: Shares, name: str) -> None:
        self.shares, self.name = shares, name
        self.work: asyncio.Future[Any] | None = None
        self._given = False

    def _give_back(self, _: object = None) -> None:
        if not self._given:
            self._given = True
            self.shares.give_back(self.name)

    def done(self) -> None:
        if self.work is None or self.work.done():
            self._give_back()
        else:
            self.work.add_done_callback(self._give_back)


def _take_share(request: web.Request, pool: str) -> _Held:
    """A thread of `pool` ("receiver" or "hand-over") for the caller's token, or 429."""
    readers, settings = request.app[BODY_READERS], request.app[SETTINGS]
    if pool == "receiver":
        shares, share = readers.receivers, settings.receivers_per_token
    else:
        shares, share = readers.handovers, settings.handovers_per_token
    name = principal(request).name
    if not shares.take(name, share):
        refused = RateLimited(
            f"token {name!r} already has {share} {pool} threads; retry once one of its "
            "bodies has arrived",
            retry_after=SHARE_RETRY_AFTER,
        )
        refused.close_connection = True  # its body is unread: aiohttp would linger on it
        raise refused
    return _Held(shares, name)


async def read_large_body(request: web.Request, limit: int) -> memoryview:
    """The whole body in one writable buffer, 413 past `limit`; large ones from a thread."""
    length = request.content_length
    if length is not None and length > limit:
        raise TooLarge(f"body is larger than the {limit}-byte limit")
    transport = request.transport
    if (
        length is None
        or length < THREAD_MIN
        or transport is None
        or transport.get_extra_info("ssl_object") is not None
    ):
        return memoryview(await read_writable_body(request, limit))
    # Not zeroed first, as a bytearray would be (~0.1 s of the loop's CPU per GB): every
    # byte is written by the receive. (Not an anonymous mmap either: fresh pages faulted in
    # one by one cost ~0.8 s per GB here; this comes from malloc's reused arena.)
    settings = request.app[SETTINGS]
    idle, rate = settings.body_timeout, settings.body_min_rate
    deadline = time.monotonic() + idle + length / rate if rate else float("inf")
    held = _take_share(request, "receiver")
    try:
        body = numpy.empty(length, numpy.uint8).data
        with reading_body(request):
            got = _take_buffered(request, body)
            problem = await _on_receiver(request, held, _receive, body[got:], idle, deadline)
    finally:
        held.done()
    if problem == "idle":
        raise BodyTimeout(f"no body bytes arrived for {idle:g} s")
    if problem == "slow":
        raise BodyTimeout(f"the body arrived slower than {rate} bytes/s")
    if problem:
        raise InvalidRequest("body ended before its Content-Length")
    return body


async def receive_descriptor(request: web.Request) -> int:
    """The open file a client on this machine hands over (`DESCRIPTOR_TYPE`): a one-byte
    body carrying it (SCM_RIGHTS), sent once this answers `100 Continue`, so aiohttp's
    reads, which would drop it, never see it. The caller owns (closes) what it returns."""
    transport = request.transport
    sock = None if transport is None else transport.get_extra_info("socket")
    if sock is None or sock.family != socket.AF_UNIX:
        raise InvalidRequest("a file descriptor can only be handed over on the local socket")
    if request.content_length != 1:
        raise InvalidRequest("a descriptor body is one byte")
    idle = request.app[SETTINGS].body_timeout
    held = _take_share(request, "receiver")
    try:
        with reading_body(request):
            if _take_buffered(request, memoryview(bytearray(1))):
                raise InvalidRequest("the descriptor was sent before 100 Continue")
            await request.writer.write(CONTINUE)
            request.writer.output_size = 0  # not part of the answer
            problem, fd = await _on_receiver(request, held, _receive_descriptor, idle)
    finally:
        held.done()
    if problem == "idle":
        raise BodyTimeout(f"no descriptor arrived for {idle:g} s")
    if problem:
        raise InvalidRequest(problem)
    return fd


async def with_descriptor(
    request: web.Request, job: Callable[[int, threading.Event], T], writes: int | None = None
) -> T:
    """Receive the descriptor handed over and run `job(fd, stop)` on a handover thread; the
    job owns the descriptor (closes it), so no one closes it under a read or write (and
    lets its number name another file meanwhile). The job is shielded from this handler's
    cancellation: shutdown stops it as it aborts a body being read, by setting `stop`,
    which the job checks between pieces. The token's hand-over share is taken before the
    descriptor is asked for, so a refusal leaves the client's file unsent.

    The work is bounded as a body's time is: `stop` is also set once body_timeout plus the
    bytes at stake at `body_min_rate` have passed (408), and when the client leaves (its
    end of the socket closes). The bytes at stake: `writes` for a job writing that many
    into the file, else the file's allocated blocks, not its size: a sparse file of 8 EiB
    costs one byte to send and kept a core reading zeros for hours after its client left.

    And by its progress: a job looks at `stop` between pieces, so a job that has not looked
    for body_timeout plus a piece at body_min_rate is stuck in a read or write that does not
    return (a hung FUSE or network file system). Once stopped, the handler waits STOP_GRACE
    for the job; one still running is answered 408 `request_timeout` and left behind: its
    thread stays blocked in the kernel (with the descriptor, and the token's hand-over
    share) until the file system answers, and shutdown leaves it (`exit_if_stuck`)."""
    held = _take_share(request, "hand-over")
    try:
        fd = await receive_descriptor(request)
        stop = _Progress()
        try:
            work = writes if writes is not None else _allocated(fd)
            held.work = working = asyncio.get_running_loop().run_in_executor(
                request.app[RUNTIME].handover, job, fd, stop
            )
        except BaseException:  # not scheduled (shutting down): nobody else will close it
            os.close(fd)
            raise
        with _Bounded(request, stop, work) as bound:
            try:
                with reading_body(request):
                    return await bound.outcome(working)
            except BaseException as e:
                stop.set()
                working.add_done_callback(_retrieved)  # its error, if any, went with the abort
                if bound.why and not isinstance(e, RequestTimeout):
                    raise BodyTimeout(bound.why) from None
                raise
    finally:
        held.done()


def _allocated(fd: int) -> int:
    """Bytes the file handed over holds on disk (0 for what is not a regular file, which
    the job refuses)."""
    info = os.fstat(fd)
    return info.st_blocks * 512 if stat.S_ISREG(info.st_mode) else 0


class _Progress(threading.Event):
    """A hand-over job's `stop`. The job looks at it between pieces, so each look is a
    piece done: `last` (time.monotonic()) tells a job that reads or writes from one stuck
    in the kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.last = time.monotonic()

    def is_set(self) -> bool:
        self.last = time.monotonic()
        return super().is_set()


class _Bounded:
    """Sets `stop` (with `why`) at the hand-over's deadline, when the job has made no
    progress for `stall` seconds, or when its client leaves."""

    def __init__(self, request: web.Request, stop: _Progress, work: int) -> None:
        settings = request.app[SETTINGS]
        self.stop, self.why = stop, ""
        self.seconds = self.stall = settings.body_timeout
        if settings.body_min_rate:
            self.seconds += work / settings.body_min_rate
            self.stall += HANDOVER_PIECE / settings.body_min_rate
        transport = request.transport
        conn = None if transport is None else transport.get_extra_info("socket")
        self._sock: socket.socket | None = None if conn is None else conn.dup()
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._watch: asyncio.TimerHandle | None = None
        self._cut_now: asyncio.Future[None] = self._loop.create_future()

    async def outcome(self, working: asyncio.Future[T]) -> T:
        """What the job returns; if it is stopped and does not end within STOP_GRACE,
        408 `request_timeout` without it. Not cancelled with this handler (shutdown)."""
        either: list[asyncio.Future[Any]] = [working, self._cut_now]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not working.done():
            await asyncio.wait([working], timeout=STOP_GRACE)
        if not working.done():
            idle = time.monotonic() - self.stop.last
            raise RequestTimeout(
                f"{self.why}: its read or write has not returned for {idle:.0f} s (its file "
                "system does not answer); the server stopped waiting for it"
            )
        return working.result()

    def _check_progress(self) -> None:
        idle = time.monotonic() - self.stop.last
        if idle >= self.stall:
            self._cut("stalled")
        else:
            self._watch = self._loop.call_later(self.stall - idle, self._check_progress)

    def __enter__(self) -> _Bounded:
        self._timer = self._loop.call_later(self.seconds, self._cut, "deadline")
        self._watch = self._loop.call_later(self.stall, self._check_progress)
        if self._sock is None:  # the connection is gone already
            self._cut("left")
        else:
            # Its reading is paused (the receiver took the socket): only a close, or bytes
            # a client may not send, make this dup readable.
            self._loop.add_reader(self._sock.fileno(), self._readable)
        return self

    def __exit__(self, *_: object) -> None:
        for timer in (self._timer, self._watch):
            if timer is not None:
                timer.cancel()
        if self._sock is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()

    def _readable(self) -> None:
        assert self._sock is not None
        self._loop.remove_reader(self._sock.fileno())
        try:
            left = not self._sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return
        except OSError:
            left = True
        if left:
            self._cut("left")

    def _cut(self, reason: str) -> None:
        if self._cut_now.done():
            return
        if reason == "deadline":
            self.why = f"the file handed over was not done within {self.seconds:g} s"
        elif reason == "stalled":
            self.why = f"the file handed over made no progress for {self.stall:g} s"
        else:
            self.why = "the client left before its file was done"
        self.stop.set()
        self._cut_now.set_result(None)


def _retrieved(done: asyncio.Future[Any]) -> None:
    if not done.cancelled():
        done.exception()


async def expect_descriptor(request: web.Request) -> None:
    """The expect handler of a route that takes descriptors: `100 Continue` for one is
    sent by `receive_descriptor`, after the handler took the socket; anything else is
    answered as aiohttp would."""
    if request.content_type == DESCRIPTOR_TYPE or request.version != HttpVersion11:
        return
    if request.headers.get("Expect", "").lower() != "100-continue":
        raise web.HTTPExpectationFailed(text=f"unknown Expect: {request.headers['Expect']}")
    await request.writer.write(CONTINUE)
    request.writer.output_size = 0


async def _on_receiver(request: web.Request, held: _Held, fn: Callable[..., T], *args: Any) -> T:
    """`fn(sock, *args)` on a receiver thread, `sock` a dup of the request's socket, the
    thread counted in `held` until `fn` returns; if the handler is cancelled meanwhile
    (shutdown), the socket is shut, which ends `fn` at its next wait, and a descriptor it
    received after all is closed."""
    assert request.transport is not None
    sock: socket.socket = request.transport.get_extra_info("socket").dup()
    loop = asyncio.get_running_loop()
    receiving = loop.run_in_executor(request.app[RUNTIME].receive, fn, sock, *args)
    held.work = receiving
    receiving.add_done_callback(lambda _: sock.close())
    try:
        return await asyncio.shield(receiving)
    except asyncio.CancelledError:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        receiving.add_done_callback(_close_unclaimed)
        raise


def _close_unclaimed(done: asyncio.Future[Any]) -> None:
    if not done.cancelled() and done.exception() is None:
        result = done.result()
        if isinstance(result, tuple) and result[1] >= 0:
            os.close(result[1])


def _take_buffered(request: web.Request, body: memoryview) -> int:
    """Move what aiohttp already took off the socket into `body`, and stop it taking more;
    returns the bytes moved. Each read of its buffer may resume its parser, which then hands
    over bytes it held back, so it is read until empty; all of it runs without yielding to
    the loop, so no socket read slips in between."""
    got = 0
    while data := request.content.read_nowait(-1):
        body[got : got + len(data)] = data
        got += len(data)
    request.content.feed_eof()  # no lingering after the answer to read a body that is gone
    request.protocol.close()  # no further request on this connection: see above
    request[_TAKEN] = True  # and the answer says so (`close_taken`)
    assert request.transport is not None
    request.transport.pause_reading()  # last: feed_eof resumed it
    return got


def _receive(sock: socket.socket, into: memoryview, idle: float, deadline: float) -> str:
    """Fill `into` from the (non-blocking) socket: "" once full, "idle" if nothing came for
    `idle` seconds, "slow" if it is not full by `deadline` (time.monotonic), "ended" if the
    peer closed first. Returns rather than raises: after a cancellation nobody awaits it."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    while into:
        try:
            n = sock.recv_into(into)
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                return "slow"
            if not poller.poll(min(idle, left) * 1000):
                return "idle" if left > idle else "slow"
            continue
        except OSError:
            return "ended"
        if n == 0:
            return "ended"
        into = into[n:]
    return ""


def _receive_descriptor(sock: socket.socket, idle: float) -> tuple[str, int]:
    """(problem, -1) or ("", the descriptor received): one byte with one descriptor."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    while True:
        try:
            msg, fds, flags, _ = socket.recv_fds(sock, 1, 1)
        except BlockingIOError:
            if not poller.poll(idle * 1000):
                return "idle", -1
            continue
        except OSError:
            return "the connection ended before the descriptor", -1
        if not msg and not fds:
            return "the connection ended before the descriptor", -1
        if flags & socket.MSG_CTRUNC or len(fds) != 1:  # more than one: the kernel closed them
            for fd in fds:
                os.close(fd)
            return "the body must carry exactly one file descriptor", -1
        return "", fds[0]


async def close_taken(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: an answer to a request whose body a receiver took says
    `Connection: close`, so the client does not send another request down it."""
    if request.get(_TAKEN):
        response.force_close()
        response.headers["Connection"] = "close"  # the headers are made before this hook
