"""`Schedule`: which maintenance task is due next, and when.

Pure: it reads no clock, so the times come from the caller (the service's loop, a test).
Each task runs every `interval` seconds, the first time one interval after the start; an
interval of 0 (or less) never runs it. After a run, successful, skipped or failed alike,
the task is due again one interval after the time the caller says it ended.
"""

from __future__ import annotations

from collections.abc import Mapping


class Schedule:
    def __init__(self, intervals: Mapping[str, float], now: float) -> None:
        self._every = {name: every for name, every in intervals.items() if every > 0}
        self._due = {name: now + every for name, every in self._every.items()}

    def next(self) -> tuple[str, float] | None:
        """The task due first and the time it is due (ties: the first in the intervals'
        order), or None when nothing is scheduled."""
        if not self._due:
            return None
        name = min(self._due, key=self._due.__getitem__)
        return name, self._due[name]

    def ran(self, name: str, now: float) -> None:
        """`name` ran (or was skipped) and ended at `now`."""
        self._due[name] = now + self._every[name]
