"""One token's engine calls cannot take every worker thread (issue 30).

The writer is held, so each PATCH of token A holds a worker while it waits for its write.
With `worker_threads = 4` a token may hold 2 of them: A's four PATCHes take two workers and
wait in A's own queue for the rest, and token B's listing, which needs no write, is
answered meanwhile. Before the shares, A's four PATCHes held all four workers and B's
listing waited until the writer moved again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path
from typing import Any

from checkpoint_vault.api import Settings, create_app
from checkpoint_vault.api.keys import TURNS, VAULT
from checkpoint_vault.vault import FakeClock

from ..conftest import Api

BOUND = 20.0  # seconds any step may take: a bound on a hang, never a pace


async def test_a_tokens_calls_wait_in_its_queue_while_another_is_served(
    aiohttp_client: Any, settings: Settings, tmp_path: Path
) -> None:
    settings = dataclasses.replace(settings, worker_threads=4)
    client = await aiohttp_client(create_app(settings, FakeClock()))
    api = Api(client, (settings.data_dir / "admin.token").read_text().strip(), settings.data_dir)
    rec = await api.save("team-a/run", {"w": b"x" * 1000})
    await api.save("team-b/run", {"w": b"y" * 1000})
    token_a = await api.token_for("write:team-a/*", "read:team-a/*", "delete:team-a/*", name="a")
    token_b = await api.token_for("read:team-b/*", name="b")
    app = client.server.app
    turns, writer = app[TURNS], app[VAULT].store.writer

    release = threading.Event()
    held = writer.submit(lambda w: release.wait(BOUND * 3))  # every write waits behind it
    path = f"/v1/namespaces/team-a/run/checkpoints/{rec['id']}"
    patches = [
        asyncio.create_task(api.call("PATCH", path, token=token_a, json={"tags": [f"t{i}"]}))
        for i in range(4)
    ]
    try:
        for _ in range(int(BOUND * 100)):  # A's calls reached their share and its queue
            if turns.held("a") == 2 and turns.waiting("a") == 2:
                break
            await asyncio.sleep(0.01)
        assert (turns.held("a"), turns.waiting("a")) == (2, 2)
        listing = await asyncio.wait_for(
            api.json("GET", "/v1/namespaces/team-b/run/checkpoints", token=token_b), BOUND
        )
        assert len(listing["checkpoints"]) == 1
    finally:
        release.set()
    held.result(BOUND)
    answers = await asyncio.wait_for(asyncio.gather(*patches), BOUND)
    assert [r.status for r in answers] == [200] * 4
    assert turns.held("a") == 0
