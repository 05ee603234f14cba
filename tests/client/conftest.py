"""A real server process for client tests, shared by the module; each test uses its own
namespace, so tests stay independent while paying for one server start."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from client import VaultClient

from ..serverproc import ServerProcess, free_port


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root: Path = tmp_path_factory.mktemp("server")
    proc = ServerProcess(root / "data", free_port(), root / "server.log")
    try:
        proc.start()
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def vault(server: ServerProcess) -> Iterator[VaultClient]:
    with VaultClient(server.url, server.token, progress=False) as client:
        yield client
