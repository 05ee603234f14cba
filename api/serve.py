"""`ckpt serve`: run the service until SIGTERM or SIGINT, then shut down cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket
import ssl
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiohttp import web
from checkpoint_vault.node.handoff import Adopter, RareLog
from checkpoint_vault.node.peercred import WorkerPeers, worker_listener
from checkpoint_vault.node.supervisor import worker_pids
from checkpoint_vault.node.tls import exposure, server_context

from checkpoint_vault.vault.libc import M_ARENA_MAX, M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, mallopt
from checkpoint_vault.vault.ownership import prepare_data_dir
from checkpoint_vault.vault.runtime import exit_if_stuck, os_name

from .app import create_app
from .heads import Unheaded
from .keys import ADOPTED, RUNTIME, UNHEADED
from .observability import AccessLogger, configure_logging
from .settings import Settings, SettingsError


def tune_malloc() -> None:
    """Keep glibc from hoarding the multi-MiB buffers that streaming allocates and frees,
    without paying page faults for every chunk.

    glibc raises its mmap threshold each time a large block is freed, after which 8 MiB
    pieces come from per-thread arenas that fragment and are never returned; pinning the
    threshold sends them back to the kernel on free (measured: server heap during a 1 GiB
    upload ~135 MiB -> ~95 MiB). Pinned at 256 KiB, though, every 256 KiB chunk and frame
    was a fresh mmap: faulted in page by page and unmapped again, which made each copy of
    a chunk run at ~1 GB/s. At 32 MiB, chunks and the client's 16 MiB batch bodies (its
    frames are built inside them) reuse arena memory kept by a 64 MiB trim threshold (at
    4 MiB, 8 MiB bodies were fresh mmaps again: the kernel time of a 1 GB save rose by
    ~1 s). Two arenas at most: each thread that allocated pieces (the ingest of a file
    handed over runs on whichever worker is free) otherwise kept its own arena and up to
    the trim threshold of freed memory in it; the benchmark's server peaked at ~372 MiB
    instead of ~247. A no-op where there is no glibc.
    """
    mallopt(M_MMAP_THRESHOLD, 32 << 20)
    mallopt(M_TRIM_THRESHOLD, 64 << 20)
    mallopt(M_ARENA_MAX, 2)


class _Listener(socket.socket):
    """A listening TCP socket that refuses, at accept, a connection that would leave fewer
    than `spare` descriptors under the process's limit (RLIMIT_NOFILE).

    Past the limit accept() itself failed with EMFILE, asyncio logged a traceback for each
    try, and every request that needed a descriptor (a receiver's dup, an LMDB read, a
    log file) failed too: 1,050 idle connections under a 1,024 limit made health take
    70 s. Linux gives a new descriptor the lowest free number, so the number the accepted
    connection got says how many are in use: no count to keep. A refused connection is
    closed at once (the client sees it reset and may retry); the refusals are logged a
    line a second at most, with how many there were. With `unheaded` set (TCP), one past
    the bound closes the oldest connection that never sent a request head instead, if
    there is one (api/heads.py), so idle connections cannot keep everyone else out."""

    def __init__(
        self, family: int, kind: int, proto: int, bound: int = 1 << 62, fileno: int | None = None
    ) -> None:  # socket.dup() makes its copy as type(self)(family, type, proto, fileno=...)
        super().__init__(family, kind, proto, fileno)
        self.bound = bound  # descriptor numbers from here on are refused
        self.unheaded: Unheaded | None = None  # where accepted connections are noted
        self._refused = RareLog("connections refused at accept")

    def accept(self) -> tuple[socket.socket, object]:
        for _ in range(128):  # the backlog asyncio accepts per wakeup; more wait
            conn, addr = super().accept()  # BlockingIOError once the backlog is empty
            # Past the bound, a connection that never sent a head makes room (api/heads.py):
            # its number is free once its transport closes, a loop turn later.
            past = conn.fileno() >= self.bound
            if self.unheaded is not None and (not past or self.unheaded.make_room()):
                self.unheaded.opened(conn, addr)
                return conn, addr
            if not past:
                return conn, addr
            conn.close()
            self._refused.note(f"descriptors {self.bound} and up are kept spare")
        raise ConnectionAbortedError  # asyncio's "nothing more to accept now"


def unix_listener(path: str, spare: int) -> socket.socket:
    """A Unix socket bound at `path` (a stale socket file there replaced), refusing
    connections past the descriptor bound as `_Listener` does: the writing process's
    sockets for its workers and local clients, which a flood forwarded to it used to fill
    up to its limit (1,023 descriptors, 6,120 EMFILE log lines)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    sock = _Listener(socket.AF_UNIX, socket.SOCK_STREAM, 0, _descriptor_bound(spare))
    try:
        sock.bind(path)
    except BaseException:
        sock.close()
        raise
    return sock


def _descriptor_bound(spare: int) -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 62 if soft == resource.RLIM_INFINITY else max(64, soft - spare)


def inherited(fds: list[int], spare: int, unheaded: Unheaded) -> list[socket.socket]:
    """The listening sockets a worker got from the writing process (api/workers.py), each
    refusing connections past this process's descriptor bound and noting those it takes
    in `unheaded` until their first request head."""
    bound = _descriptor_bound(spare)
    out: list[socket.socket] = []
    for fd in fds:
        probe = socket.socket(fileno=fd)
        family, kind, proto = probe.family, probe.type, probe.proto
        listener = _Listener(family, kind, proto, bound, fileno=probe.detach())
        listener.unheaded = unheaded
        out.append(listener)
    return out


def listeners(host: str, port: int, spare: int, copies: int = 1) -> list[list[socket.socket]]:
    """Bound (not yet listening) TCP sockets for `host`:`port`, one per address it names,
    each refusing connections past the descriptor bound (`_Listener`); `copies` such sets,
    one per process answering on the port (api/workers.py).

    Several copies are bound together with SO_REUSEPORT, so the kernel spreads new
    connections evenly over the processes (one socket shared by all of them let the
    writing process, first to wake, take nearly every connection). A plain bind is tried
    first, and closed, so that a port another server listens on is still refused, as it
    is with one process: SO_REUSEPORT alone would let a second `ckpt serve` share it
    unnoticed. The writing process keeps every copy open, so connections queued on a
    worker that died wait for its successor, which inherits the same socket."""
    bound = _descriptor_bound(spare)
    out: list[list[socket.socket]] = [[] for _ in range(copies)]
    seen = set()
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    try:
        for family, kind, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            if copies > 1 and port:
                _bind(_Listener(family, kind, proto, bound), address, False).close()
            for group in out:
                sock = _bind(_Listener(family, kind, proto, bound), address, copies > 1)
                group.append(sock)
                address = sock.getsockname()  # a port 0 became one: the copies share it
    except BaseException:
        for sock in (s for group in out for s in group):
            sock.close()
        raise
    return out


def _bind(sock: socket.socket, address: Any, shared: bool) -> socket.socket:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if sock.family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock


def cannot_hold_socket(directory: Path) -> str | None:
    """Why a Unix socket cannot be bound in `directory` (some network and FUSE file
    systems refuse), or None. Tried under a name of its own: the real path may belong to a
    server still running on this data dir, which the vault's lock refuses only later."""
    probe = directory / f".ckpt-socket-probe-{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.bind(str(probe))
        probe.unlink()
    except OSError as e:
        return e.strerror or repr(e)
    return None


def _local_socket(settings: Settings, log: logging.Logger) -> Settings:
    """The settings to serve with: the local socket turned off, and why logged, when it
    cannot be had."""
    path = settings.socket_path
    if path is None:
        if settings.local_socket and settings.tls_cert is None:
            log.warning("no local socket: the data dir's path is too long for a socket address")
        return settings
    problem = cannot_hold_socket(path.parent)
    if problem is not None:
        log.warning("no local socket: %s cannot hold one (%s)", path.parent, problem)
        return replace(settings, local_socket=False)  # nor does health name one
    log.info("local socket %s (files handed over by descriptor)", path)
    return settings


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context `[server] tls_*` describe, or None for plain HTTP."""
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    _check_key(settings.tls_key, settings.tls_key_shared)
    try:
        return server_context(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
    except (OSError, ssl.SSLError) as e:
        raise SettingsError(f"[server] tls_cert / tls_key / tls_client_ca: {e}") from None


def own_data_dir(settings: Settings) -> None:
    """Refuse, with `UnsafePath` and before anything is written there, a data dir that is
    not the server's alone (vault/ownership.py). A socket an earlier run left is ours and is
    bound afresh; anything else at a socket's path is refused, never unlinked."""
    os.umask(0o077)  # what the server creates is its own, whatever the caller's umask
    sockets = (
        settings.socket_path,
        settings.engine_socket,
        settings.calls_socket,
        settings.handoff_socket,
    )
    prepare_data_dir(settings.data_dir, [p for p in sockets if p is not None])


def serve(settings: Settings) -> None:
    os_name("ckpt-serve")  # the event loop's thread: what ps and top show for the process
    tune_malloc()
    configure_logging(settings.log_format)
    tls = tls_context(settings)  # a refused key creates no data dir
    own_data_dir(settings)  # then: a refused data dir gets nothing written, nor logged
    log = logging.getLogger("ckpt.api")
    log.info(
        "serving %s on %s://%s:%d%s",
        settings.data_dir,
        "https" if tls else "http",
        settings.host,
        settings.port,
        " (client certificates required)" if settings.tls_client_ca else "",
    )
    settings = _local_socket(settings, log)
    # With workers, they answer on the port and this process (which writes) does not: its
    # copies of their sockets stay open here, so connections a dead worker's socket holds
    # wait for its successor.
    groups = listeners(settings.host, settings.port, settings.spare_descriptors, settings.answering)
    socks, copies = (groups[0], []) if settings.processes == 1 else ([], groups)
    paths = [str(p) for p in (settings.socket_path,) if p is not None]
    app = create_app(settings, listening=copies)
    # SIGTERM (or SIGINT) is a graceful exit: stop accepting, let in-flight requests finish
    # (up to shutdown_timeout), then the cleanup context stops the workers, drains the
    # writer and closes LMDB; the process exits 0. As `web.run_app` does it: the signal
    # ends the loop, then only the main task is cancelled, whose cleanup lets the handlers
    # answer; whatever is left is cancelled after.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    main = loop.create_task(_run(app, settings, socks, paths, tls))
    try:
        loop.run_until_complete(main)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        main.cancel()
        with contextlib.suppress(asyncio.CancelledError, web.GracefulExit):
            loop.run_until_complete(main)
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    runtime = app.get(RUNTIME)
    if runtime is not None:
        exit_if_stuck(runtime)  # a hand-over blocked in a hung file system's read


async def _run(
    app: web.Application,
    settings: Settings,
    socks: list[socket.socket],
    paths: list[str],
    tls: ssl.SSLContext | None,
) -> None:
    """What `web.run_app` does, keeping the runner, whose server adopts the connections
    workers hand over (api/handoff.py). A connection must send a whole request head within
    header_timeout of opening it or of its previous answer (aiohttp's keep-alive timer runs
    from the connection's start), or it is closed. The Unix sockets speak plain HTTP."""
    runner = web.AppRunner(
        app,
        handle_signals=True,
        access_log=logging.getLogger("ckpt.access"),
        access_log_class=AccessLogger,
        keepalive_timeout=settings.header_timeout,
        shutdown_timeout=settings.shutdown_timeout,
    )
    await runner.setup()
    adopter = None
    try:
        for sock in socks:
            assert isinstance(sock, _Listener)
            sock.unheaded = app[UNHEADED]
        sites: list[web.BaseSite] = [web.SockSite(runner, s, ssl_context=tls) for s in socks]
        spare = settings.spare_descriptors
        sites += [web.SockSite(runner, unix_listener(path, spare)) for path in paths]
        sites += [web.SockSite(runner, s) for s in _engine_socket(app, settings)]
        for site in sites:
            await site.start()
        if settings.processes > 1 and settings.handoff_socket is not None:
            assert runner.server is not None  # set up above
            path = settings.handoff_socket
            peers = WorkerPeers(path.name, lambda: worker_pids(app))
            bound = _descriptor_bound(spare)
            adopter = Adopter(str(path), runner.server, peers, app[ADOPTED], bound)
        await asyncio.Event().wait()  # until a signal raises GracefulExit
    finally:
        if adopter is not None:
            adopter.close()
        await runner.cleanup()


def _engine_socket(app: web.Application, settings: Settings) -> list[socket.socket]:
    """The socket the workers forward to (api/forward.py), if there are workers: 0600, and
    taking connections from them alone (api/peercred.py)."""
    path = settings.engine_socket
    if settings.processes == 1 or path is None:
        return []
    peers = WorkerPeers(path.name, lambda: worker_pids(app))
    return [worker_listener(str(path), peers, bound=_descriptor_bound(settings.spare_descriptors))]


def _check_key(key: Path, shared: bool) -> None:
    """Refuse a TLS key every user of the host can read, unless `[server] tls_key_shared`
    says it is meant to be; warn when only its group can."""
    try:
        open_to = exposure(key)
    except OSError as e:
        raise SettingsError(f"[server] tls_key: {e}") from None
    if open_to is None:
        return
    message, world = open_to
    if world and not shared:
        raise SettingsError(f"[server] tls_key: {message}, or set [server] tls_key_shared = true")
    logging.getLogger("ckpt.api").warning("TLS key: %s", message)
