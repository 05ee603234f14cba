"""`Pacer`: how a long maintenance read (compaction, scrub) keeps under its byte rate and
stops when the server does.

Pacing sleeps whenever the bytes done so far are ahead of `rate` bytes per second since the
start; the sleep is a wait on the `stop` event, so a shutdown wakes a compaction paced to
days at once instead of leaving SIGTERM to wait for it. Each step (a batch of chunks) also
checks `stop` before the next starts: a stopped task raises `MaintenanceStopped` (503)
between steps, each of which committed on its own, so nothing is left half done.
"""

from __future__ import annotations

import threading
import time

from .errors import MaintenanceStopped


class Pacer:
    """Paces one run of `operation` to `rate` bytes per second (None or 0: no limit)."""

    def __init__(
        self, operation: str, rate: float | None, stop: threading.Event | None = None
    ) -> None:
        self.operation = operation
        self.rate = rate
        self.stop = stop if stop is not None else threading.Event()  # never set: a sleep
        self.started = time.monotonic()

    def check(self) -> None:
        """Raise `MaintenanceStopped` if the server is stopping: called between steps."""
        if self.stop.is_set():
            raise MaintenanceStopped(f"{self.operation} stopped: the server is shutting down")

    def pace(self, done: int) -> None:
        """`done` bytes are read so far: wait until that is within the rate (waking at
        once on `stop`), then check `stop`."""
        if self.rate:
            ahead = done / self.rate - (time.monotonic() - self.started)
            if ahead > 0:
                self.stop.wait(ahead)  # pacing, not synchronisation: set only to stop
        self.check()
