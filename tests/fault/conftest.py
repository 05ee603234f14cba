"""Fixtures for the fault tests: a real server process that can be killed and restarted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ..serverproc import ServerProcess, free_port

__all__ = ["ServerProcess", "crash_server"]


@pytest.fixture
def crash_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A running `ckpt serve` over a fresh data dir, its local socket on (files may be
    handed over by descriptor); SIGKILLed at teardown if still alive."""
    server = ServerProcess(
        tmp_path / "data", free_port(), tmp_path / "server.log", local_socket=True
    )
    try:
        server.start()
        yield server
    finally:
        server.stop()
