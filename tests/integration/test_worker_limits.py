"""Quotas, uncommitted bytes, upload sessions and body sizes, enforced through a worker.

With two or more server processes (the default on a machine with two CPUs) every request
on the port is answered by a worker: it prepares one-request saves itself and forwards or
hands over every other change to the process that writes (node/forward.py, node/calls.py).
tests/integration/test_limits.py checks each limit on one process in process; here each is
checked as a user meets it, on a real `ckpt serve --workers 2`, with the health answer of
the same connection proving that a worker, not the writing process, took the request.
"""

from __future__ import annotations

import http.client
import json
import os
from collections.abc import Iterator
from typing import Any

import blake3
import pytest

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.errors import QuotaExceeded

from ..serverproc import ServerProcess, free_port

CONFIG = """
[quotas]
"ns-a/*" = 100000
[uploads]
max_sessions_per_token = 2
max_pending_bytes_per_token = 100000
[server]
max_batch_body = "1MiB"
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("limits")
    config = root / "ckpt.toml"
    config.write_text(CONFIG)
    server = ServerProcess(root / "data", free_port(), root / "server.log", config, workers=2)
    try:
        server.start()
        yield server
    finally:
        server.stop()


class Worker:
    """One connection the health answer shows a worker holds: every request on it is the
    worker's to answer, forward or hand over."""

    def __init__(self, server: ServerProcess, token: str) -> None:
        self._token = token
        self.conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
        self.conn.request("GET", "/v1/health")
        self.worker = json.loads(self.conn.getresponse().read())["worker"]

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self._token}"}
        if body is not None:
            headers["Content-Type"] = "application/octet-stream"
        self.conn.request(method, path, body=body, headers=headers)
        resp = self.conn.getresponse()
        self.headers = resp.headers
        return resp.status, json.loads(resp.read() or b"null")

    def json(self, method: str, path: str, payload: object) -> tuple[int, Any]:
        return self.call(method, path, json.dumps(payload).encode())

    def close(self) -> None:
        self.conn.close()


def _worker(server: ServerProcess, token: str) -> Worker:
    conn = Worker(server, token)
    assert conn.worker > 0, "the writing process answered on the port"  # it never should
    return conn


def _token(server: ServerProcess, name: str, scope: str) -> str:
    with VaultClient(server.url, server.token, local_files=False) as admin:
        return admin.create_token(name, [scope]).token


@pytest.mark.slow
def test_a_quota_holds_for_saves_a_worker_prepares_and_commits_it_forwards(
    service: ServerProcess,
) -> None:
    """A one-request save (prepared by the worker, committed by the writer) and a session
    commit (forwarded) are both refused 507 past the namespace's quota; other namespaces
    carry on."""
    with VaultClient(service.url, service.token, local_files=False) as c:
        c.save("ns-a/one", {"f": os.urandom(60_000)}, chunking="small")
        with pytest.raises(QuotaExceeded):
            c.save("ns-a/two", {"f": os.urandom(60_000)}, chunking="small")
        c.save("ns-b/x", {"f": os.urandom(60_000)}, chunking="small")
        assert [q.used for q in c.stats().quotas] == [60_000]
    conn = _worker(service, service.token)
    try:
        status, up = conn.json("POST", "/v1/namespaces/ns-a/three/uploads", {})
        assert status == 201, up
        status, info = conn.call(
            "PUT", f"/v1/uploads/{up['upload_id']}/files/f", os.urandom(60_000)
        )
        assert status == 201, info
        status, body = conn.json("POST", f"/v1/uploads/{up['upload_id']}/commit", {})
        assert (status, body["error"]["code"]) == (507, "quota_exceeded")
    finally:
        conn.close()


def test_uncommitted_bytes_and_sessions_are_bounded_per_token_through_a_worker(
    service: ServerProcess,
) -> None:
    """A token's open sessions (429 `too_many_uploads`, with Retry-After) and the bytes
    its sessions hold uncommitted (507) are bounded whichever process took the request."""
    w = _token(service, "w", "write:t/*")
    conn = _worker(service, w)
    try:
        status, first = conn.json("POST", "/v1/namespaces/t/a/uploads", {})
        assert status == 201, first
        status, info = conn.call(
            "PUT", f"/v1/uploads/{first['upload_id']}/files/f", os.urandom(60_000)
        )
        assert status == 201, info
        status, second = conn.json("POST", "/v1/namespaces/t/b/uploads", {})
        assert status == 201, second
        data = os.urandom(60_000)
        batch = blake3.blake3(data).digest() + len(data).to_bytes(4, "little") + data
        status, body = conn.call("POST", f"/v1/uploads/{second['upload_id']}/chunks", batch)
        assert (status, body["error"]["code"]) == (507, "quota_exceeded")
        status, body = conn.json("POST", "/v1/namespaces/t/c/uploads", {})
        assert (status, body["error"]["code"]) == (429, "too_many_uploads")
        assert conn.headers["Retry-After"]
        status, _ = conn.call("DELETE", f"/v1/uploads/{first['upload_id']}")
        assert status == 204
        status, out = conn.call("POST", f"/v1/uploads/{second['upload_id']}/chunks", batch)
        assert (status, out["created"]) == (200, 1)
    finally:
        conn.close()


def test_a_body_past_the_batch_limit_is_refused(service: ServerProcess) -> None:
    """`max_batch_body` bounds a chunk batch taken on a worker's connection (one this
    large is handed over to the writing process, which reads it): 413, nothing stored."""
    conn = _worker(service, service.token)
    try:
        status, up = conn.json("POST", "/v1/namespaces/big/x/uploads", {})
        assert status == 201, up
        data = os.urandom((1 << 20) + 1000)
        batch = blake3.blake3(data).digest() + len(data).to_bytes(4, "little") + data
        status, body = conn.call("POST", f"/v1/uploads/{up['upload_id']}/chunks", batch)
        assert (status, body["error"]["code"]) == (413, "too_large")
    finally:
        conn.close()
    with VaultClient(service.url, service.token, local_files=False) as c:
        assert not c.list("big/x")
