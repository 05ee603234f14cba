"""Shared fixtures: an engine on a temp dir, and the real service on loopback."""

from __future__ import annotations

import asyncio
import io
import os
import secrets
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import blake3
import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from checkpoint_vault.api import Settings, create_app
from checkpoint_vault.cluster import ClusterConfig
from checkpoint_vault.cluster.shards import upload_prefix
from checkpoint_vault.vault import FakeClock, Vault, VaultConfig

from .cluster import Cluster
from .seaweed import SeaweedFS
from .serverproc import ServerProcess, free_port


def pytest_configure() -> None:
    """The servers and CLI processes the tests start (hundreds of them) keep our compiled
    modules: under PYTHONDONTWRITEBYTECODE (which some sandboxes set) each one compiled all
    of them again, ~0.2 s of CPU per process start (import of serve, cli and client: 0.64 s
    against 0.45 s with the caches). Their caches go where Python puts them (`__pycache__`,
    ignored by git); this process's own imports are already done."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The test files that hold a slow test first, each in its usual order, then the many
    quick ones. xdist hands files out in this order (`--no-loadscope-reorder` in addopts;
    its default, most tests first, started the one-test files of a minute or more last,
    while the other worker had nothing left to do)."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # stable: files and tests keep order


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def vault(tmp_path: Path, clock: FakeClock) -> Iterator[Vault]:
    v = Vault(tmp_path / "vault", VaultConfig(map_size=1 << 20, gc_grace=60.0), clock)
    yield v
    v.close()


def hexhash(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


@dataclass
class Api:
    """A real HTTP client against the real app on a loopback port."""

    client: TestClient[Any, Any]
    token: str
    data_dir: Path

    def auth(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.token}"}

    async def raw(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        content_length: int | None = None,
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection that sent `method path` byte for byte (HTTP client libraries
        normalize `..`), as admin, and `body`, which may be shorter than `content_length`
        (default its length): for requests no client library would send."""
        server = self.client.server
        reader, writer = await asyncio.open_connection(server.host, server.port)
        length = len(body) if content_length is None else content_length
        lines = [f"{method} {path} HTTP/1.1", "Host: x", f"Authorization: Bearer {self.token}"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        lines += [f"Content-Length: {length}", "", ""]
        writer.write("\r\n".join(lines).encode() + body)
        await writer.drain()
        return reader, writer

    async def call(
        self,
        method: str,
        path: str,
        *,
        token: str | None = None,
        expect: int | None = None,
        **kwargs: Any,
    ) -> ClientResponse:
        headers = {**self.auth(token), **kwargs.pop("headers", {})}
        if isinstance(kwargs.get("data"), bytes):  # aiohttp warns on large raw bodies
            kwargs["data"] = io.BytesIO(kwargs["data"])
        resp = await self.client.request(method, path, headers=headers, **kwargs)
        if expect is not None:
            body = await resp.read()
            assert resp.status == expect, f"{method} {path}: {resp.status} {body[:500]!r}"
        return resp

    async def worst_health(self, rounds: int = 20) -> float:
        """The slowest of `rounds` health requests sent one after another: run beside a
        flood, a blocked event loop shows here."""
        worst = 0.0
        for _ in range(rounds):
            start = time.perf_counter()
            resp = await self.client.get("/v1/health")
            assert resp.status == 200
            worst = max(worst, time.perf_counter() - start)
        return worst

    async def json(self, method: str, path: str, expect: int = 200, **kwargs: Any) -> Any:
        resp = await self.call(method, path, expect=expect, **kwargs)
        return await resp.json()

    async def open(self, ns: str, **body: Any) -> dict[str, Any]:
        result: dict[str, Any] = await self.json(
            "POST", f"/v1/namespaces/{ns}/uploads", expect=201, json=body
        )
        return result

    async def save(self, ns: str, files: dict[str, bytes], **body: Any) -> dict[str, Any]:
        """Stream each file through the server-side chunker, then commit."""
        up = await self.open(ns, **body)
        for name, data in files.items():
            info = await self.json(
                "PUT", f"/v1/uploads/{up['upload_id']}/files/{name}", expect=201, data=data
            )
            assert info["size"] == len(data)
            assert info["hash"] == hexhash(data)
        result: dict[str, Any] = await self.json(
            "POST", f"/v1/uploads/{up['upload_id']}/commit", expect=201, json={}
        )
        return result

    async def read(self, ns: str, ref: str, name: str, **kwargs: Any) -> bytes:
        resp = await self.call(
            "GET", f"/v1/namespaces/{ns}/checkpoints/{ref}/files/{name}", **kwargs
        )
        body = await resp.read()
        assert resp.status in (200, 206), f"{resp.status} {body[:300]!r}"
        return body

    async def token_for(self, *scopes: str, name: str = "t") -> str:
        out = await self.json(
            "POST", "/v1/admin/tokens", expect=201, json={"name": name, "scopes": list(scopes)}
        )
        return str(out["token"])


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """A server's settings for in-process tests; with CKPT_TEST_CLUSTER=1, a 1-node cluster
    (one shard, its objects in a local directory): the suite run against what a cluster's
    process adds (issue 43)."""
    vault = VaultConfig(map_size=4 << 20, gc_grace=0.0, max_chunk_size=1 << 20)
    if not os.environ.get("CKPT_TEST_CLUSTER"):
        return Settings(data_dir=tmp_path / "data", vault=vault)
    cluster = ClusterConfig(
        node="solo", url="http://127.0.0.1:9", shards=1, store=(tmp_path / "cluster").as_uri()
    )
    return Settings(
        data_dir=tmp_path / "data",
        vault=replace(vault, upload_id_prefix=upload_prefix(0)),
        cluster=cluster,
    )


@pytest.fixture
async def api(aiohttp_client: Any, settings: Settings, clock: FakeClock) -> AsyncIterator[Api]:
    client = await aiohttp_client(create_app(settings, clock))
    token = (settings.data_dir / "admin.token").read_text().strip()
    return Api(client, token, settings.data_dir)


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """One real S3-compatible server for the session (tests use their own prefixes)."""
    server = SeaweedFS(tmp_path_factory.mktemp("seaweed"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def cluster(tmp_path: Path, seaweed: SeaweedFS) -> Iterator[Cluster]:
    """Three shard processes behind HAProxy over the session's SeaweedFS (tests/cluster.py);
    a test module that needs another shape (standbys, extra settings) defines its own."""
    c = Cluster(tmp_path, seaweed, secrets.token_hex(4))
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture
def two_processes(tmp_path: Path) -> Iterator[ServerProcess]:
    """A running `ckpt serve --workers 2` (the writing process and one worker) over a fresh
    data dir; SIGKILLed at teardown if still alive."""
    server = ServerProcess(tmp_path / "data", free_port(), tmp_path / "server.log", workers=2)
    try:
        server.start()
        yield server
    finally:
        server.stop()
