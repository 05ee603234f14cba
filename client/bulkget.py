"""Large downloads: the body read straight into a few reused buffers while another thread
consumes them.

A file download runs on one of the transport's threads (client/connections.py): the socket
is read into reused 4 MiB buffers (`readinto`, which drops the interpreter lock, no fresh
bytes per read), and a second thread consumes each filled buffer (hashes and writes it)
while the next one fills, so receiving, hashing and writing overlap.

`Broken` means "the network failed": the caller retries from where the body stopped.
Anything the consumer raises (a full disk) passes through unchanged.
"""

from __future__ import annotations

import http.client
import mmap
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor

from .connections import Broken, Connections, ask, finish, read

BUFFER = 4 << 20  # bytes per socket read: large enough that per-read overhead vanishes
BUFFERS = 3  # one filling, one being consumed, one spare so neither waits on the other


class Stopped(Exception):
    """The download was abandoned by its caller (cancelled)."""


Refusal = Callable[[int, Mapping[str, str], bytes], Exception]


def receive(
    conns: Connections,
    path: str,
    headers: Mapping[str, str],
    start: int,
    consume: Callable[[memoryview], None],
    refusal: Refusal,
    stop: threading.Event,
) -> None:
    """GET `path` from byte `start` to its end, handing the body to `consume` in order, on
    one other thread. Raises `Broken` when the network fails (what was consumed before it
    stays consumed: the caller counts it in `consume` and resumes after it), and
    `refusal(status, headers, body)` for an error answer."""
    hdrs = dict(headers)
    if start:
        hdrs["Range"] = f"bytes={start}-"
    conn, resp = ask(conns, "GET", conns.prefix + path, hdrs)
    try:
        if resp.status >= 400:
            raise refusal(resp.status, dict(resp.getheaders()), read(resp, -1))
        if start and resp.status != 206:
            raise Broken(f"asked from byte {start}, got status {resp.status} instead of 206")
        _pump(resp, consume, stop)
    finally:
        finish(conns, conn, resp)


def _pump(
    resp: http.client.HTTPResponse, consume: Callable[[memoryview], None], stop: threading.Event
) -> None:
    """Socket → buffers → `consume` on a second thread; a buffer is refilled only once the
    consumer is done with it. Every buffer handed over is consumed before this returns or
    raises, and a consumer's error wins over a network one."""
    # Anonymous maps: page-aligned, as a consumer writing with direct I/O needs them.
    buffers = [memoryview(mmap.mmap(-1, BUFFER)) for _ in range(BUFFERS)]
    pending: list[Future[None] | None] = [None] * BUFFERS
    with ThreadPoolExecutor(1, thread_name_prefix="ckpt-consume") as consumer:
        try:
            i = 0
            while True:
                if stop.is_set():
                    raise Stopped("download cancelled")
                previous, pending[i] = pending[i], None
                if previous is not None:
                    previous.result()
                n = _fill(resp, buffers[i])
                if n == 0:
                    return
                pending[i] = consumer.submit(consume, buffers[i][:n])
                i = (i + 1) % BUFFERS
        finally:
            for fut in pending:
                if fut is not None:
                    fut.result()


def _fill(resp: http.client.HTTPResponse, buffer: memoryview) -> int:
    """Bytes read into `buffer` (it fills up unless the body ends); 0 at the body's end.
    http.client reports a body cut short as its end, so the remaining length is checked."""
    try:
        n = resp.readinto(buffer)
    except (OSError, http.client.HTTPException) as e:
        raise Broken(f"reading the body: {e!r}") from e
    if n == 0 and resp.length:
        raise Broken(f"the body ended {resp.length} bytes early")
    return n
