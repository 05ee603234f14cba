"""What a crowd of connections costs the process that writes, and another client (issue 41,
findings 2 and 5), against a real `ckpt serve` with its default workers under a 1,024
descriptor limit (RLIMIT_NOFILE, as on many hosts).

- 2,000 unauthenticated PUT heads announcing a large body: the workers handed each
  connection to the writing process before authenticating it, which held them until it ran
  out of descriptors (EMFILE logged per try, admin calls taking seconds).
- 1,000 small bodies dripped under one write token: each was forwarded as it came, so each
  held one of the writing process's descriptors.
- 1,500 connections sending nothing: every worker reached its descriptor bound and reset
  new connections from anyone for the 30 s of the header timeout.

The crowd runs on an event loop of its own in a thread of this process (its connections are
this process's descriptors, its limit raised for them), while this thread checks that
another tenant's save, a listing and an admin call succeed, that the writing process's
descriptors (/proc/PID/fd) stay clear of its limit, and counts the server's log lines other
than its access log. The latencies are printed (`-s`), not asserted: two shared cores make
a one-second bound flaky.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import resource
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.client import RetryPolicy, VaultClient

from ..serverproc import ServerProcess, free_port

pytestmark = pytest.mark.slow  # every test here takes over a second (the quick loop skips them)

NOFILE = 1024  # the server's descriptor limit
SPARE = 320  # `server.spare_descriptors`'s default: the writer's bound is NOFILE - SPARE
FORWARDS_PER_TOKEN = 32  # `server.forwards_per_token`'s default
CROWD_SHARE = 100  # of the writing process's descriptors the crowd may cost, at most
HOLD = 6.0  # seconds the crowd is held while the others are served
WAIT = 30.0  # seconds: a bound on any one wait, not a pace
LOG_LINES = 100  # fewer than this per minute (each test runs well under one)
OTHER_CLIENT = "127.0.0.2"  # loopback answers all of 127/8: another client's address


class Crowd:
    """`n` connections from 127.0.0.1, each sent `head` and then held, on an event loop in
    a thread of this process; `opened` of them connected, `statuses` what those answered
    had been answered by the end (0: closed without an answer)."""

    def __init__(self, server: ServerProcess, n: int, head: bytes) -> None:
        self.server, self.n, self.head = server, n, head
        self.opened = 0
        self.statuses: Counter[int] = Counter()
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Future[None] | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._run(),))

    def __enter__(self) -> Crowd:
        self._thread.start()
        assert self._ready.wait(WAIT), "the crowd did not connect in time"
        return self

    def __exit__(self, *_: object) -> None:
        self._loop.call_soon_threadsafe(self._end)
        self._thread.join(WAIT)
        self._loop.close()

    def _end(self) -> None:
        assert self._stop is not None
        self._stop.set_result(None)

    async def _run(self) -> None:
        self._stop = self._loop.create_future()
        held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        gate = asyncio.Semaphore(200)  # connecting at once: the listen backlogs are 128

        async def one() -> None:
            async with gate:
                try:
                    opening = asyncio.open_connection(self.server.host, self.server.port)
                    reader, writer = await asyncio.wait_for(opening, 5)
                except (OSError, asyncio.TimeoutError):
                    return
                if self.head:
                    writer.write(self.head)
                held.append((reader, writer))

        await asyncio.gather(*(one() for _ in range(self.n)))
        self.opened = len(held)
        self._ready.set()
        await self._stop
        # What came back by now is in each reader's buffer already: a short wait each.
        reads = [asyncio.ensure_future(reader.read(12)) for reader, _ in held]
        await asyncio.wait(reads, timeout=1)
        for read in reads:
            if read.done() and not read.exception():
                head = read.result()
                self.statuses[int(head[9:12]) if head.startswith(b"HTTP/1.1 ") else 0] += 1
            read.cancel()
        for _, writer in held:
            writer.transport.abort()


@contextlib.contextmanager
def _our_descriptors() -> Iterator[None]:
    """This process's soft descriptor limit raised to its hard one, for the crowd."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (before[1], before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        tmp_path / "data", free_port(), tmp_path / "server.log", workers=0, nofile=NOFILE
    )
    try:
        with _our_descriptors():
            proc.start()
            yield proc
    finally:
        proc.stop()


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _log_lines(server: ServerProcess) -> list[str]:
    """The server's log lines but its access log's (one per request, by design)."""
    text = server.log_path.read_text(errors="replace")
    return [line for line in text.splitlines() if '"ckpt.access"' not in line]


def _client(server: ServerProcess, token: str) -> VaultClient:
    """A client that tries each call once: a refusal must show, not be retried away."""
    return VaultClient(server.url, token, retry=RetryPolicy(attempts=1), local_files=False)


def _others_are_served(server: ServerProcess, tenant: str) -> tuple[dict[str, float], int]:
    """For HOLD seconds, another tenant's save and listing and an admin call, each of which
    must succeed; returns each one's slowest time (seconds) and the writing process's
    most descriptors seen meanwhile."""
    assert server.pid is not None
    slowest = {"save": 0.0, "tag": 0.0, "list": 0.0, "admin": 0.0}
    most = 0
    with _client(server, tenant) as other, _client(server, server.token) as admin:
        saved: list[str] = []
        end = time.monotonic() + HOLD
        while time.monotonic() < end:
            for what, call in (
                ("save", lambda: saved.append(other.save("other", {"f": os.urandom(2000)}).id)),
                ("tag", lambda: other.tag("other", saved[-1], ["seen"])),  # forwarded
                ("list", lambda: other.list("other")),
                ("admin", lambda: admin.stats()),  # forwarded
            ):
                start = time.monotonic()
                call()
                slowest[what] = max(slowest[what], time.monotonic() - start)
                most = max(most, _descriptors(server.pid))
    return {k: round(v, 3) for k, v in slowest.items()}, most


def _tokens(server: ServerProcess) -> tuple[str, str]:
    """A write token for the crowd's tenant, and a read-write one for another tenant."""
    with _client(server, server.token) as admin:
        crowd = admin.create_token("crowd", ["write:crowd"]).token
        other = admin.create_token("other", ["write:other", "read:other"]).token
    return crowd, other


def _check(server: ServerProcess, crowd: Crowd, what: str, other: str, before: int) -> None:
    """`before`: the writing process's descriptors before the crowd came. The crowd may
    cost it a few (the forwards a token may have in flight), never hundreds."""
    started = time.monotonic()
    slowest, most = _others_are_served(server, other)
    lines = _log_lines(server)
    minutes = (time.monotonic() - started) / 60
    print(
        f"{what}: {crowd.opened} held; slowest {slowest}; writer descriptors {before} -> {most}; "
        f"{len(lines)} log lines in {minutes * 60:.0f} s"
    )
    assert most < NOFILE - SPARE, f"the writing process held {most} descriptors"
    assert most - before < CROWD_SHARE, f"the writing process held {most} descriptors"
    assert len(lines) < LOG_LINES * max(1.0, minutes), "\n".join(lines[-5:])[:3000]


def test_unauthenticated_large_heads_never_reach_the_writer(server: ServerProcess) -> None:
    """Before: the writing process adopted every connection and ran out of descriptors
    (1,023 held, EMFILE logged per try). Now the workers answer 401 themselves."""
    head = (
        b"PUT /v1/uploads/u1/chunks/" + b"0" * 64 + b" HTTP/1.1\r\nHost: x\r\n"
        b"Content-Length: 100000000\r\n\r\n"
    )
    _, other = _tokens(server)
    assert server.pid is not None
    before = _descriptors(server.pid)
    with _our_descriptors(), Crowd(server, 2000, head) as crowd:
        _check(server, crowd, "unauthenticated large heads", other, before)
    print(f"unauthenticated large heads answered: {dict(crowd.statuses)}")
    # Answered by the workers, and their connections closed at once (body unread).
    assert crowd.statuses[401] >= 0.9 * crowd.opened, crowd.statuses


def test_dripped_small_bodies_of_one_token_never_fill_the_writer(server: ServerProcess) -> None:
    """Before: each of them was forwarded as its bytes came, holding one of the writing
    process's descriptors. Now a worker reads a small body whole before forwarding it, and
    a token passes `forwards_per_token` at once (429 past them)."""
    token, other = _tokens(server)
    head = (
        b"POST /v1/namespaces/crowd/uploads HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Bearer " + token.encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
    )
    assert server.pid is not None
    before = _descriptors(server.pid)
    with _our_descriptors(), Crowd(server, 1000, head) as crowd:
        _check(server, crowd, "dripped small bodies", other, before)
    # Each worker passes 32 of the token's requests at once (`forwards_per_token`); the
    # rest were refused (a few may not have been read yet, or were still arriving).
    print(f"dripped small bodies answered: {dict(crowd.statuses)}")
    passed = len(server.worker_pids()) * FORWARDS_PER_TOKEN
    assert crowd.statuses[429] >= crowd.opened - passed - 100, crowd.statuses


def _health_from(server: ServerProcess, source: str) -> int:
    conn = http.client.HTTPConnection(
        server.host, server.port, timeout=WAIT, source_address=(source, 0)
    )
    try:
        conn.request("GET", "/v1/health")
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except OSError:
        return 0
    finally:
        conn.close()


def test_idle_connections_of_one_client_leave_room_for_another(server: ServerProcess) -> None:
    """Before: 1,500 connections sending nothing took every worker to its descriptor
    bound, and new connections from anyone were reset while they were held. Now each
    address holds `headless_per_client` such connections per process, its oldest closed
    for newer ones."""
    with _our_descriptors(), Crowd(server, 1500, b"") as crowd:
        statuses = [_health_from(server, OTHER_CLIENT) for _ in range(40)]
        print(f"idle connections: {crowd.opened} opened; health from another: {statuses}")
        assert statuses == [200] * 40, statuses
    lines = _log_lines(server)
    assert len(lines) < LOG_LINES, "\n".join(lines[-5:])[:3000]


@pytest.mark.parametrize(
    ("setting", "status"), [("adopted_per_token = 2", 429), ("adopted_connections = 2", 503)]
)
def test_connections_handed_to_the_writer_are_bounded(
    tmp_path: Path, setting: str, status: int
) -> None:
    """Large bodies' connections are handed to the writing process whole, which held as
    many as came. Now it holds `adopted_per_token` per token (429 past them) and
    `adopted_connections` in all (the worker answers 503): 5 batches whose bodies never
    come, under a bound of 2, get 3 refusals (before: no answer while they waited)."""
    config = tmp_path / "vault.toml"
    config.write_text(f"[server]\n{setting}\n")
    proc = ServerProcess(tmp_path / "data", free_port(), tmp_path / "server.log", config, workers=2)
    try:
        proc.start()
        with _client(proc, proc.token) as admin:
            token = admin.create_token("big", ["write:big"]).token
        with _client(proc, token) as producer:
            upload = producer.begin_upload("big").id
        head = (
            f"POST /v1/uploads/{upload}/chunks HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {token}\r\nContent-Length: {8 << 20}\r\n\r\n"
        ).encode()
        with Crowd(proc, 5, head) as crowd:
            deadline = time.monotonic() + WAIT
            while time.monotonic() < deadline and _answers(proc, "/chunks", status) < 3:
                time.sleep(0.05)  # polling the server's access log, bounded by WAIT
        print(f"{setting}: {crowd.opened} {dict(crowd.statuses)}")
        assert crowd.statuses[status] == 3, crowd.statuses
    finally:
        proc.stop()


def _answers(server: ServerProcess, route: str, status: int) -> int:
    """Answers of `status` to paths ending in `route` so far, by the server's access log."""
    text = server.log_path.read_text(errors="replace")
    said = (f'{route} {status}"', f'"status": {status}')
    return sum(1 for line in text.splitlines() if all(s in line for s in said))


@pytest.mark.parametrize(
    ("setting", "status"), [("forwards_per_token = 2", 429), ("forwards_per_worker = 2", 503)]
)
def test_requests_passed_to_the_writer_are_bounded(
    tmp_path: Path, setting: str, status: int
) -> None:
    """A worker passes `forwards_per_token` of a token's requests to the writing process
    at once (429 past them) and `forwards_per_worker` in all (503): of 10 small bodies
    that never finish, each of the 2 workers passes 2 at most, so 6 to 8 are refused,
    however the kernel spread them (before: every one forwarded, no answer)."""
    config = tmp_path / "vault.toml"
    config.write_text(f"[server]\n{setting}\n")
    proc = ServerProcess(tmp_path / "data", free_port(), tmp_path / "server.log", config, workers=2)
    try:
        proc.start()
        with _client(proc, proc.token) as admin:
            token = admin.create_token("slow", ["write:slow"]).token
        head = (
            f"POST /v1/namespaces/slow/uploads HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: 100\r\n\r\n{{"
        ).encode()
        with Crowd(proc, 10, head) as crowd:
            deadline = time.monotonic() + WAIT
            while time.monotonic() < deadline and _answers(proc, "/uploads", status) < 6:
                time.sleep(0.05)  # polling the server's access log, bounded by WAIT
        print(f"{setting}: {crowd.opened} {dict(crowd.statuses)}")
        assert 6 <= crowd.statuses[status] <= 8, crowd.statuses
        assert crowd.statuses[status] == sum(crowd.statuses.values()), crowd.statuses
    finally:
        proc.stop()
