"""Each token waits in its own queue for its share of the worker pool (api/turns.py)."""

from __future__ import annotations

import asyncio

import pytest

from checkpoint_vault.api.turns import Turns


async def _hold(turns: Turns, name: str, entered: asyncio.Event, leave: asyncio.Event) -> None:
    async with turns.turn(name):
        entered.set()
        await leave.wait()


async def test_past_its_share_a_token_waits_and_another_does_not() -> None:
    turns = Turns(2)
    leave = asyncio.Event()
    entered = [asyncio.Event() for _ in range(4)]
    tasks = [asyncio.create_task(_hold(turns, "a", e, leave)) for e in entered[:3]]
    tasks.append(asyncio.create_task(_hold(turns, "b", entered[3], leave)))
    await asyncio.wait_for(asyncio.gather(entered[0].wait(), entered[1].wait()), 10)
    await asyncio.wait_for(entered[3].wait(), 10)  # b is not behind a
    assert (turns.held("a"), turns.waiting("a"), turns.held("b")) == (2, 1, 1)
    assert not entered[2].is_set()
    leave.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert entered[2].is_set()  # a's third call took the turn its first gave back
    assert (turns.held("a"), turns.waiting("a"), turns.held("b")) == (0, 0, 0)


async def test_a_cancelled_waiter_leaves_the_queue_and_the_turns_stay_counted() -> None:
    turns = Turns(1)
    leave, entered = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_hold(turns, "a", entered, leave))
    await asyncio.wait_for(entered.wait(), 10)
    waiter = asyncio.create_task(_hold(turns, "a", asyncio.Event(), leave))
    for _ in range(100):  # until it queued: a bounded number of loop passes
        if turns.waiting("a"):
            break
        await asyncio.sleep(0)
    assert turns.waiting("a") == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (turns.held("a"), turns.waiting("a")) == (1, 0)
    leave.set()
    await asyncio.wait_for(holder, 10)
    assert turns.held("a") == 0
    third = asyncio.Event()
    await asyncio.wait_for(_hold(turns, "a", third, leave), 10)  # the turn came back
    assert third.is_set()


async def test_no_share_is_no_bound() -> None:
    turns = Turns(0)
    async with turns.turn("a"), turns.turn("a"), turns.turn("a"):
        assert turns.held("a") == 0
