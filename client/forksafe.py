"""Objects that own an event loop on a thread of their own (`VaultClient`, and the LangGraph
`VaultSaver` through it) and what a fork does to them.

After fork the child's copy has no threads, and shares the parent's sockets: tearing the
copy down (shutting its pooled connections, closing the loop's wake-up pipe) would break
the parent's requests. So in the child the copy's loop is marked closed (any call on it
fails at once with "Event loop is closed" instead of waiting) and the copy is kept, never
closed nor freed. The parent holds only a weak
reference; the child makes its own client.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from typing import Protocol


class LoopOwner(Protocol):
    @property
    def _loop(self) -> asyncio.AbstractEventLoop: ...


class _InertInChild:
    def __init__(self, owner: LoopOwner) -> None:
        self._ref = weakref.ref(owner)
        self._kept: LoopOwner | None = None

    def __call__(self) -> None:
        owner = self._ref()
        if owner is not None:
            owner._loop._closed = True  # type: ignore[attr-defined]  # asyncio's own flag
            self._kept = owner


def inert_after_fork(owner: LoopOwner) -> int:
    """Make `owner` inert in forked children; returns this process's id, which the owner
    compares with os.getpid() to know it is a child's copy."""
    os.register_at_fork(after_in_child=_InertInChild(owner))
    return os.getpid()
