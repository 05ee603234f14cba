"""A real server process for client tests, shared by the module; each test uses its own
namespace, so tests stay independent while paying for one server start."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from client import VaultClient

from ..serverproc import ServerProcess, free_port


def running_server(
    tmp_path_factory: pytest.TempPathFactory, local_socket: bool = False
) -> Iterator[ServerProcess]:
    """A started server in a fresh directory, stopped when the generator is closed."""
    root: Path = tmp_path_factory.mktemp("server")
    proc = ServerProcess(root / "data", free_port(), root / "server.log", local_socket=local_socket)
    try:
        proc.start()
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from running_server(tmp_path_factory)


@pytest.fixture
def vault(server: ServerProcess) -> Iterator[VaultClient]:
    with VaultClient(server.url, server.token, progress=False) as client:
        yield client
