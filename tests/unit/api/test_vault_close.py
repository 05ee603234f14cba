"""The vault closes whole even when the task waiting for it is cancelled (issue 41, low): a
second SIGTERM cancels that task; the close thread's future was cancelled with it, and its
`set_result` raised `InvalidStateError: CANCELLED` on the terminal. The close is now waited
for through the cancellation, which is raised after it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from checkpoint_vault.api.app import _through_cancellation
from checkpoint_vault.vault.runtime import Runtime


async def test_a_cancelled_waiter_still_waits_for_the_close_and_nothing_is_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    release, closed = threading.Event(), threading.Event()

    def engine_close() -> None:
        release.wait(10)
        closed.set()

    closing = Runtime().close_in_thread(engine_close)
    waiter = asyncio.ensure_future(_through_cancellation(asyncio.wrap_future(closing)))
    await asyncio.sleep(0)
    waiter.cancel()  # as a second SIGTERM does
    await asyncio.sleep(0)
    assert not waiter.done()  # still waiting for the close
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert closed.is_set()
    assert closing.result() is None
    assert raised == []
