"""Progress bars for long saves and loads: tqdm on a terminal, nothing otherwise."""

from __future__ import annotations

import sys
from typing import Any


class Progress:
    """`enabled=None` means: only when stderr is a terminal."""

    def __init__(self, enabled: bool | None, total: int, label: str) -> None:
        on = sys.stderr.isatty() if enabled is None else enabled
        self._bar: Any = None
        if on:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=label, unit="B", unit_scale=True, leave=False)

    @property
    def shown(self) -> bool:
        return self._bar is not None

    def update(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def note(self, text: str) -> None:
        """Show `text` beside the bar (files, dedup so far: what bytes alone do not say)."""
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()
