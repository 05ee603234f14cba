"""The service's shutdown leaves the event loop running while it waits for the vault."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from checkpoint_vault.api.app import create_app
from checkpoint_vault.api.keys import VAULT
from checkpoint_vault.api.settings import Settings


@pytest.mark.timeout(60)
async def test_closing_leaves_the_loop_free_for_a_download_to_let_go(settings: Settings) -> None:
    """A download lets go of its pinned pages in a callback on the event loop, and closing
    the vault waits for every pin: a shutdown that blocked the loop meanwhile waited
    forever for a release queued just before (seen once in CI)."""
    app = create_app(settings)
    runner = web.AppRunner(app)
    await runner.setup()
    env = app[VAULT].store.frames_env
    pin = env.pin()
    loop = asyncio.get_running_loop()
    close = env.close
    released: list[bool] = []

    def release() -> None:
        pin.release()
        released.append(True)

    def close_with_a_release_queued() -> None:
        loop.call_soon_threadsafe(release)  # what a sender finishing just then does
        close()

    env.close = close_with_a_release_queued  # type: ignore[method-assign]
    await runner.cleanup()
    assert released == [True]
