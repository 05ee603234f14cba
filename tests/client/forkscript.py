"""Fork tests run in a fresh interpreter: under pytest a forked child happens to keep its
inherited objects alive, which hides the bug these tests look for."""

from __future__ import annotations

import os
import subprocess
import sys

from ..serverproc import ServerProcess


def run_fork_script(server: ServerProcess, script: str, *args: str) -> str:
    """Run `script` against `server`; returns its stdout, after checking it exited 0 and
    printed no unclosed-resource warning (a freed copy of the parent's client)."""
    env = {**os.environ, "CKPT_URL": server.url, "CKPT_TOKEN": server.token}
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,  # bounds a hang only: the parent waits for ever on a broken loop
    )
    assert done.returncode == 0, done.stderr
    assert "Unclosed" not in done.stderr
    return done.stdout
