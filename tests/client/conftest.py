"""A real server process for client tests, shared by the module; each test uses its own
namespace, so tests stay independent while paying for one server start."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from checkpoint_vault.client import VaultClient

from ..serverproc import ServerProcess, free_port


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module that sets `BOTH_TRANSPORTS = True` runs each test that takes `server` twice:
    against a server with its default, the local socket on (files on disk handed over by
    descriptor, as `ckpt push` on the server's machine does), and with it off (every byte
    over HTTP, as from another machine). The `server` fixture reads the choice as its param."""
    if getattr(metafunc.module, "BOTH_TRANSPORTS", False) and "server" in metafunc.fixturenames:
        metafunc.parametrize(
            "server", [True, False], ids=["socket", "http"], indirect=True, scope="module"
        )


@pytest.fixture(scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A started server in a fresh directory; with its local socket (files handed over
    by descriptor) when the test module sets `LOCAL_SOCKET = True`, or as parametrized
    under `BOTH_TRANSPORTS`; with `WORKERS = n` server processes (default one)."""
    root: Path = tmp_path_factory.mktemp("server")
    local_socket = bool(getattr(request, "param", getattr(request.module, "LOCAL_SOCKET", False)))
    workers = int(getattr(request.module, "WORKERS", 1))
    proc = ServerProcess(
        root / "data", free_port(), root / "server.log", local_socket=local_socket, workers=workers
    )
    try:
        proc.start()
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def vault(server: ServerProcess) -> Iterator[VaultClient]:
    with VaultClient(server.url, server.token, progress=False) as client:
        yield client


def loaded_by(module: str, heavy: Iterable[str]) -> str:
    """Which of the top-level packages `heavy` a fresh interpreter has loaded after
    `import module`, as printed ("[]": none): an integration imports its framework only
    when used."""
    names = sorted(heavy)
    code = (
        f"import sys, {module}; "
        f"print(sorted(set({names!r}) & {{m.split('.')[0] for m in sys.modules}}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()
