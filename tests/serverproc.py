"""A real `ckpt serve` process for tests: started, SIGKILLed, SIGTERMed and restarted.

The server runs as a child process on a free loopback port over a data directory under
`tmp_path`. `ServerProcess.restart()` starts a new process on the same port and data dir;
readiness is detected by polling `GET /v1/health` (a bounded number of attempts, a short
timeout each), never by a fixed sleep. Teardown SIGKILLs whatever is still running.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import random
import re
import resource
import signal
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import IO

import pytest

READY_ATTEMPTS = 300  # x up to POLL_INTERVAL each: a start may take ~15 s on a slow machine
POLL_INTERVAL = 0.05  # seconds between health probes (waiting on the process, see _wait_ready)
PROBE_TIMEOUT = 0.5  # seconds for one health probe


# free_port picks from here up to the kernel's ephemeral range; below it are Ray's worker
# ports (10002-19999, tests/integration/test_s3_ray.py)
LOWEST_PORT = 20000


def _ephemeral_floor() -> int:
    """The first port of the kernel's ephemeral range (Linux: 32768 unless changed)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def free_port() -> int:
    """A loopback port nobody is bound to right now, for a server to bind a moment later.

    Picked at random below the kernel's ephemeral range, where no `bind(0)` and no
    outgoing connection on the machine lands: a port from that range (the kernel's pick
    for port 0, as this was) could be taken by another process before the server bound it,
    and a server of another test (another xdist worker, another suite) then answered the
    readiness probe in its place (seen once: `admin.token` missing after a healthy start).
    Where the range leaves no room below it, the kernel's pick."""
    floor = _ephemeral_floor()
    rng = random.SystemRandom()
    for _ in range(200 if floor > LOWEST_PORT + 1000 else 0):
        port = rng.randrange(LOWEST_PORT, floor)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # in use, or in TIME_WAIT
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        picked: int = s.getsockname()[1]
        return picked


class ServerProcess:
    """One `ckpt serve` child at a time over a fixed data dir and port."""

    def __init__(
        self,
        data_dir: Path,
        port: int,
        log_path: Path,
        config: Path | None = None,
        extra_args: tuple[str, ...] = (),
        tls: ssl.SSLContext | None = None,
        local_socket: bool = False,
        workers: int = 1,
        nofile: int | None = None,
    ) -> None:
        """`tls`: the server speaks HTTPS (its certificate in `extra_args`); this context
        is what the readiness probe connects with. `local_socket`: the server offers its
        socket to clients on this machine, which then hand files over by descriptor
        (tests/client/test_local_files.py); off, saves take the HTTP path every remote
        client takes, which most tests are about. `workers`: server processes (`[server]
        workers`); one unless a test is about several (tests/integration/test_workers.py),
        so that per-process figures (rate limits, shares) stay what those tests count
        (0: the server's default, one per CPU). `nofile`: the server's soft RLIMIT_NOFILE
        (its workers inherit it), for tests of what it does as descriptors run short."""
        self.config = config
        self.data_dir = data_dir
        self.port = port
        self.host = "127.0.0.1"
        self.url = f"{'https' if tls else 'http'}://{self.host}:{port}"
        self.extra_args = extra_args
        self.tls = tls
        self.local_socket = local_socket
        self.workers = workers
        self.nofile = nofile
        self.log_path = log_path
        self.token = ""
        self.starts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Start the server and return once it answers health; reads the admin token."""
        assert self._proc is None, "server already running"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in _reap
        self._log.write(f"--- start #{self.starts + 1} ---\n".encode())
        self._log.flush()
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "checkpoint_vault.cli",
                "serve",
                "--data",
                str(self.data_dir),
                "--host",
                self.host,
                "--port",
                str(self.port),
                "--workers",
                str(self.workers),
                *(["--config", str(self.config)] if self.config else []),
                *self.extra_args,
            ],
            cwd=self.data_dir.parent,
            preexec_fn=None if self.nofile is None else self._lower_nofile,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith("CKPT_")},
                "CKPT_SERVER_LOCAL_SOCKET": str(self.local_socket).lower(),
            },
        )
        self.starts += 1
        self._wait_ready()
        self.token = (self.data_dir / "admin.token").read_text().strip()
        assert self.token, "admin.token is empty"

    def _lower_nofile(self) -> None:
        """In the child before exec: its soft descriptor limit (the hard one kept)."""
        assert self.nofile is not None
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, hard))

    def _probe(self) -> bool:
        conn = (
            http.client.HTTPSConnection(
                self.host, self.port, timeout=PROBE_TIMEOUT, context=self.tls
            )
            if self.tls is not None
            else http.client.HTTPConnection(self.host, self.port, timeout=PROBE_TIMEOUT)
        )
        try:
            conn.request("GET", "/v1/health")
            resp = conn.getresponse()
            resp.read()
            return resp.status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def _wait_ready(self) -> None:
        assert self._proc is not None
        for _ in range(READY_ATTEMPTS):
            if self._probe():
                return
            # Waiting on the child between probes both paces the polling and notices at
            # once a server that died during start-up.
            try:
                code = self._proc.wait(timeout=POLL_INTERVAL)
            except subprocess.TimeoutExpired:
                continue
            self._reap()
            pytest.fail(f"server exited with {code} during start-up:\n{self.log_tail()}")
        pytest.fail(f"server not healthy after {READY_ATTEMPTS} probes:\n{self.log_tail()}")

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def kill(self) -> int:
        """SIGKILL the server and reap it; returns its exit status (-9 if the kill did it)."""
        assert self._proc is not None, "server not running"
        self._proc.send_signal(signal.SIGKILL)
        code = self._proc.wait(timeout=30)
        self._reap()
        return code

    def worker_pids(self) -> list[int]:
        """The pids of the server's worker processes (`[server] workers` > 1)."""
        assert self.pid is not None, "server not running"
        kids: list[int] = []
        for task in os.listdir(f"/proc/{self.pid}/task"):
            with open(f"/proc/{self.pid}/task/{task}/children") as f:
                kids += [int(k) for k in f.read().split()]
        return kids

    def holds_open(self, path: Path) -> bool:
        """Whether the server has the file at `path` open (a file handed over, say)."""
        assert self.pid is not None, "server not running"
        for fd in Path(f"/proc/{self.pid}/fd").iterdir():
            with contextlib.suppress(OSError):  # closed meanwhile
                if os.readlink(fd) == str(path):
                    return True
        return False

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait for a clean exit; returns the exit status."""
        assert self._proc is not None, "server not running"
        self._proc.send_signal(signal.SIGTERM)
        code = self._proc.wait(timeout=timeout)
        self._reap()
        return code

    def restart(self) -> None:
        """SIGKILL (if running) and start again over the same data dir and port."""
        if self._proc is not None:
            self.kill()
        self.start()

    def _reap(self) -> None:
        self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self) -> None:
        """Teardown: SIGKILL whatever is left of this server (ours only, by pid)."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.send_signal(signal.SIGKILL)
            self._proc.wait(timeout=30)
        self._reap()

    def metrics(self) -> str:
        """The server's `/metrics` text, read with the admin token."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {self.token}"})
            resp = conn.getresponse()
            body = resp.read().decode()
            assert resp.status == 200, body[:300]
            return body
        finally:
            conn.close()

    def handed_over(self) -> dict[str, float]:
        """The server's `ckpt_handed_over_*_total` counters: files (and bytes) handed over
        by descriptor to save from (`files`, `bytes`) and to restore into
        (`restored_files`, `restored_bytes`)."""
        found = re.findall(r"^ckpt_handed_over_(\w+)_total (\S+)$", self.metrics(), re.M)
        return {what: float(n) for what, n in found}

    @property
    def socket_path(self) -> str:
        """Where the server's local socket is, when it offers one."""
        return str(self.data_dir / "ckpt.sock")

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no server log)"
        return "\n".join(text.splitlines()[-lines:])
