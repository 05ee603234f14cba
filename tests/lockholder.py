"""A separate process that holds a vault's maintenance lock until its stdin closes, and
a probe of who holds a lock now.

Run as `python -m tests.lockholder <lock file>`; it prints `held` once it holds the lock.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checkpoint_vault.vault import Vault
from checkpoint_vault.vault.maintenance import MaintenanceLock


class LockHolder:
    """Start the holder process and wait until it holds the lock; `release` lets it go."""

    def __init__(self, lock_file: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.lockholder", str(lock_file)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        assert line == "held", f"holder said {line!r}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self._reap()

    def kill(self) -> None:
        self.proc.kill()
        self._reap()

    def _reap(self) -> None:
        self.proc.wait(timeout=30)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


WAIT_LIMIT = 30.0  # seconds for a thread to block on the lock: a bound, never a pace


def assert_waits_for_holder(vault: Vault, operation: Callable[[], Any]) -> None:
    """`operation` waits for the vault's lock while another process holds it (the lock
    counts it among its waiters, and it has not finished), and finishes once it lets go."""
    holder = LockHolder(vault.path / "maintenance.lock")
    outcome: list[BaseException | None] = []

    def call() -> None:
        try:
            operation()
        except BaseException as e:
            outcome.append(e)
        else:
            outcome.append(None)

    t = threading.Thread(target=call)
    try:
        t.start()
        waiting = vault.maintenance.wait_for_waiters(1, WAIT_LIMIT)
        assert waiting, f"never waited for the lock: {outcome or 'still running'}"
        assert not outcome, "finished while another process held the lock"
    finally:
        holder.release()
        t.join(30)
    assert outcome == [None]


def holder_of(lock_file: Path) -> str | None:
    """What holds the maintenance lock at `lock_file` right now, as its holder wrote it
    ("<pid> <operation>"), or None when nothing does: how a fault test knows its kill
    landed during an operation. A shared probe: it never keeps a holder waiting longer than
    this call, and never holds the lock past it."""
    try:
        f = open(lock_file, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return None
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return f.read(200).decode(errors="replace").strip()
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return None


def main() -> None:
    lock = MaintenanceLock(Path(sys.argv[1]))
    with lock.hold("held by a test"):
        print("held", flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
