"""A real server with its S3 endpoint on, and clients pointed at it (tests/integration/
test_s3_*.py). The endpoint is on a port of its own ([s3] port); readiness is polled with
bounded attempts, never a sleep."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checkpoint_vault.protocol import s3_credentials
from tests.serverproc import ServerProcess, free_port

REGION = "us-east-1"
READY_SECONDS = 20.0


@dataclass
class S3Server:
    server: ServerProcess
    endpoint: str  # http://127.0.0.1:<s3 port>

    def credentials(self, token: str | None = None) -> tuple[str, str]:
        return s3_credentials(token or self.server.token)

    def boto3(self, token: str | None = None, **config: Any) -> Any:
        import boto3  # type: ignore[import-untyped]  # no type hints
        from botocore.config import Config  # type: ignore[import-untyped]  # no type hints

        key, secret = self.credentials(token)
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=key,
            aws_secret_access_key=secret,
            region_name=REGION,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, **config),
        )


def start(tmp_path: Path, commit_after: str = "60s") -> S3Server:
    """The server on free loopback ports, its S3 endpoint answering."""
    port, s3_port = free_port(), free_port()
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = tmp_path / "s3.toml"
    config.write_text(f'[s3]\nport = {s3_port}\ncommit_after = "{commit_after}"\n')
    data = tmp_path / "data"
    data.mkdir()
    server = ServerProcess(data, port, tmp_path / "server.log", config=config)
    server.start()
    deadline = time.monotonic() + READY_SECONDS
    while True:
        try:
            socket.create_connection(("127.0.0.1", s3_port), timeout=0.5).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # pacing the bounded poll, not synchronising on it
    return S3Server(server, f"http://127.0.0.1:{s3_port}")
