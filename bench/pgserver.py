"""A throwaway PostgreSQL for the benchmarks that compare against it (bench_langgraph.py,
bench_agents.py).

`PgServer` runs `initdb` in a fresh temp dir and `pg_ctl start` on a free loopback port
(listen_addresses=127.0.0.1, the unix socket in the temp dir), with PostgreSQL's default
durability (fsync and synchronous_commit on), so its figures are those of a stock install.
Leaving the `with` block runs `pg_ctl stop -m fast` and removes the dir, also on error.

PostgreSQL refuses to run as root: when we are root, initdb and pg_ctl run through
`runuser -u USER --` as `postgres` if that user exists, else as `ckptbench`, created once with
`useradd`. The temp dir is chowned to that user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

from bench_ingest import free_port, log

HOST = "127.0.0.1"
SUPERUSER = "postgres"  # the database role initdb creates (trust auth, loopback only)
FALLBACK_OS_USER = "ckptbench"
START_TIMEOUT_S = 60


class PgUnavailable(RuntimeError):
    """initdb / pg_ctl are not installed."""


def find_bin(name: str) -> str:
    """`name` on PATH, else the newest /usr/lib/postgresql/*/bin/`name`."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(
        glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
        key=lambda p: int(Path(p).parents[1].name) if Path(p).parents[1].name.isdigit() else 0,
    )
    if candidates:
        return candidates[-1]
    raise PgUnavailable(f"{name} not found: apt-get install postgresql")


def os_user() -> str | None:
    """The unprivileged OS user to run PostgreSQL as, or None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in (SUPERUSER, FALLBACK_OS_USER):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    subprocess.run(
        ["useradd", "--system", "--no-create-home", FALLBACK_OS_USER], check=True, timeout=30
    )
    return FALLBACK_OS_USER


class PgServer:
    """One PostgreSQL instance in a temp dir, as a context manager."""

    def __init__(self) -> None:
        self.port = free_port()
        self.user = os_user()
        self.dir = Path(tempfile.mkdtemp(prefix="bench-pg-"))
        self.data = self.dir / "data"
        self.sock = self.dir / "sock"
        self._started = False

    @property
    def conninfo(self) -> str:
        return f"host={HOST} port={self.port} user={SUPERUSER} dbname=postgres"

    def _run(self, *cmd: str) -> None:
        prefix = ["runuser", "-u", self.user, "--"] if self.user else []
        out = subprocess.run(
            [*prefix, *cmd], capture_output=True, text=True, timeout=START_TIMEOUT_S, check=False
        )
        if out.returncode != 0:
            raise RuntimeError(f"{cmd[0]} failed ({out.returncode}): {out.stderr.strip()}")

    def start(self) -> None:
        initdb, pg_ctl = find_bin("initdb"), find_bin("pg_ctl")
        self.sock.mkdir()
        if self.user:
            pw = pwd.getpwnam(self.user)
            for p in (self.dir, self.sock):
                os.chown(p, pw.pw_uid, pw.pw_gid)
        log(f"initdb + pg_ctl start on {HOST}:{self.port} in {self.dir}")
        self._run(initdb, "-D", str(self.data), "-U", SUPERUSER, "-A", "trust", "-E", "UTF8")
        opts = f"-c listen_addresses={HOST} -p {self.port} -k {self.sock}"
        self._started = True
        self._run(
            pg_ctl, "-D", str(self.data), "-l", str(self.dir / "pg.log"), "-o", opts, "-w", "start"
        )

    def stop(self) -> None:
        try:
            if self._started:
                self._run(find_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PgServer:
        try:
            self.start()
        except BaseException:
            with contextlib.suppress(Exception):  # the start error is the one to see
                self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.stop()
            return
        with contextlib.suppress(Exception):  # keep the error that got us here
            self.stop()
