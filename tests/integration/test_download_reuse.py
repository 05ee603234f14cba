"""Issue 41, first finding: a download must never deliver bytes of pages the store reused.

A download that waits in socket queues (a client that stops reading) used to hold only
*references* to the data file's page-cache pages (sendfile), while the read transaction
that kept LMDB from reusing them ended when sendfile returned. Here tenant A starts a
download on a plain socket with a 4 KiB receive buffer, reads the head and stops; A's
checkpoint is deleted and collected (GC, compaction, and the shrink they run), tenant B
saves new data, which LMDB writes into the freed pages; then A reads the rest. Every byte A
gets must be A's own (or the connection is cut short): never another tenant's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket

import blake3
import pytest

from checkpoint_vault.api import Settings
from checkpoint_vault.api.keys import VAULT
from checkpoint_vault.api.transfer import download
from checkpoint_vault.vault import FakeClock, Vault

from ..conftest import Api

MiB = 1 << 20
PAGE = 4096
ROUNDS = 20
SIZE = 4 * MiB  # one read batch: its bytes are read or copied before the status goes out
BALLAST = 96 * MiB
STALL = 5.0  # longer than a round's maintenance and saves take: A is normally not cut off


@pytest.fixture(params=[0.05, 0.0], ids=["shrink_default", "shrink_always"])
def settings(settings: Settings, request: pytest.FixtureRequest) -> Settings:
    assert Settings().vault.shrink_above == 0.05, "the first case is the default"
    return dataclasses.replace(
        settings, vault=dataclasses.replace(settings.vault, shrink_above=request.param)
    )


def _distinct(seed: bytes, size: int) -> bytes:
    """Incompressible (stored as raw frames, as A's are) and recognisable 16-byte blocks."""
    return blake3.blake3(seed).digest(length=size)


async def _save(api: Api, token: str, ns: str, data: bytes) -> str:
    up = await api.json("POST", f"/v1/namespaces/{ns}/uploads", 201, token=token, json={})
    await api.json("PUT", f"/v1/uploads/{up['upload_id']}/files/w", 201, token=token, data=data)
    rec = await api.json("POST", f"/v1/uploads/{up['upload_id']}/commit", 201, token=token, json={})
    return str(rec["id"])


async def _start_download(api: Api, token: str, path: str) -> tuple[socket.socket, bytes]:
    """A raw HTTP reader with a small receive buffer that reads the head and stops; returns
    the socket and the body bytes that came with the head."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, PAGE)  # before connect: the window
    sock.setblocking(False)
    server = api.client.server
    await loop.sock_connect(sock, (server.host, server.port))
    head = f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n"
    await loop.sock_sendall(sock, head.encode())
    got = b""
    while b"\r\n\r\n" not in got:
        more = await asyncio.wait_for(loop.sock_recv(sock, PAGE), 30)
        assert more, f"closed before the head: {got[:300]!r}"
        got += more
    status, _, body = got.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 200"), status[:300]
    return sock, body


async def _read_rest(sock: socket.socket, have: bytes) -> bytes:
    """Whatever else arrives until the body is complete or the connection ends."""
    loop = asyncio.get_running_loop()
    parts = [have]
    got = len(have)
    while got < SIZE:
        try:
            more = await asyncio.wait_for(loop.sock_recv(sock, 256 << 10), 30)
        except ConnectionResetError:
            break
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


async def _pins_gone(vault: Vault) -> None:
    """Bounded: what the server held for A's batch is let go (at once, or at the cut)."""
    for _ in range(int((STALL + 10) / 0.02)):
        if vault.store.frames_env.readers == 0:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("a read transaction is still open")


def _tally(read: bytes, mine: bytes, theirs: set[bytes]) -> tuple[int, int]:
    """(pages of `read` that differ from `mine`, of which hold a block of B's data)."""
    wrong = foreign = 0
    for at in range(0, len(read), PAGE):
        page = read[at : at + PAGE]
        if page == mine[at : at + len(page)]:
            continue
        wrong += 1
        if any(page[s : s + 16] in theirs for s in range(min(16, len(page) - 16))):
            foreign += 1
    return wrong, foreign


@pytest.mark.slow
async def test_a_stalled_download_never_reads_pages_reused_for_another_tenant(
    api: Api, clock: FakeClock, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(download, "STALL_SECONDS", STALL)
    vault: Vault = api.client.app[VAULT]
    a = await api.token_for("read:ns-a/*", "write:ns-a/*", "delete:ns-a/*", name="a")
    b = await api.token_for("read:ns-b/*", "write:ns-b/*", name="b")
    # Ballast: what one round frees stays under `shrink_above` (5%) of what is in use, so
    # with the default the freed pages are reused as they are, not punched out first.
    await _save(api, b, "ns-b/ballast", _distinct(b"ballast", BALLAST))
    wrong = foreign = pages = whole = 0
    for i in range(ROUNDS):
        mine = _distinct(b"A%d" % i, SIZE)
        ref = await _save(api, a, "ns-a/run", mine)
        path = f"/v1/namespaces/ns-a/run/checkpoints/{ref}/files/w"
        sock, body = await _start_download(api, a, path)
        try:
            await _pins_gone(vault)
            await api.call(
                "DELETE", f"/v1/namespaces/ns-a/run/checkpoints/{ref}", token=a, expect=204
            )
            clock.advance(settings.vault.upload_ttl + 1)  # A's upload no longer reserves them
            await api.json("POST", "/v1/admin/gc")  # each runs the shrink past its bound
            await api.json("POST", "/v1/admin/compact")
            # Two saves: the pages freed go to B's second save, rarely to the first (LMDB
            # hands out a page only once later transactions are durable).
            theirs = [_distinct(b"B%d-%d" % (i, k), SIZE) for k in range(2)]
            for data in theirs:
                await _save(api, b, "ns-b/run", data)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)  # read the rest fast
            read = await _read_rest(sock, body)
        finally:
            sock.close()
        assert len(read) > len(body), "A read nothing after the reuse: the round proves nothing"
        blocks = {data[k : k + 16] for data in theirs for k in range(0, SIZE, 16)}
        w, f = _tally(read, mine, blocks)
        wrong, foreign, pages = wrong + w, foreign + f, pages + -(-len(read) // PAGE)
        whole += len(read) == SIZE
    assert wrong == 0, f"{wrong} of {pages} pages read were not A's, {foreign} of them B's"
    assert whole > 0, "no round read its whole file: every download was cut short"
