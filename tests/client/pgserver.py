"""A throwaway PostgreSQL for the LangGraph import tests, from Debian's package.

`initdb` in a temp dir and `pg_ctl start` on a free loopback port with trust auth (only
loopback listens), its socket in that dir; `stop()` runs `pg_ctl stop -m immediate`.
PostgreSQL will not run as root: as root, the binaries run as the `postgres` user the
package creates. Missing binaries are installed with apt-get, as tests/browser/chromium.py
installs chromium, and named if that fails.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..aptlock import apt_lock
from ..serverproc import free_port

START_TIMEOUT = 120  # seconds for initdb or a start (-w waits for readiness itself)
OS_USER = "postgres"


def bin_dir() -> Path:
    """The newest /usr/lib/postgresql/<version>/bin, installing the package if none."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        with apt_lock():  # another xdist worker may be installing it (tests/aptlock.py)
            found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
            if not found:
                subprocess.run(
                    ["apt-get", "install", "-y", "postgresql"],
                    capture_output=True,
                    check=True,
                    timeout=600,
                )
                found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError("initdb not found: apt-get install postgresql")
    return Path(found[-1]).parent


class PostgresServer:
    """One PostgreSQL in a fresh temp dir (under /tmp, not pytest's tmp_path: that one is
    root's alone, and the server runs as another user)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="ckpt-test-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.bin = bin_dir()
        self.user = OS_USER if os.geteuid() == 0 else None

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *cmd: str) -> None:
        prefix = ["runuser", "-u", self.user, "--"] if self.user else []
        subprocess.run([*prefix, *cmd], capture_output=True, check=True, timeout=START_TIMEOUT)

    def start(self) -> None:
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust")
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off"
        log = str(self.root / "pg.log")
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", log, "-o", options, "-w", "start"
        )

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
