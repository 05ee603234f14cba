"""Crash consistency of agent saves (one request each, a small file stored as one chunk
patched against its parent's, vault/smallfile.py): SIGKILL a real `ckpt serve` 20 times
while agents save, each naming its last acknowledged save as parent.

Every save acknowledged (201, or 200 for a retry its idempotency key answered) must be
listed after every restart and read back bit-identical, its patch chain included; a save
whose answer was lost may be listed, and then reads back too. After the last restart GC
and the consistency check must find no drift, nothing missing and nothing damaged.

Seed: `SMALL_CRASH_SEED` in the environment (default below); it is printed on failure.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import random
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import blake3
import pytest

from checkpoint_vault.protocol import encode_bundle

from ..serverproc import ServerProcess

SEED = int(os.environ.get("SMALL_CRASH_SEED", "20261129"))
KILLS = 20
AGENTS = 6
ACKS_PER_ROUND = 6  # saves acknowledged after a (re)start before the next kill is armed
MAX_KILL_DELAY = 0.25  # seconds: the kill lands uniformly in [0, this) once armed
PROGRESS_TIMEOUT = 30.0
WORDS = ("plan", "tool", "call", "result", "diff", "file", "ok", "error", "retry", "step")
TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)
NS = "agents"


@dataclass
class Save:
    key: str
    thread: str
    state: bytes
    parent: str | None
    acked: str | None = None  # the checkpoint id the server answered with
    unknown: bool = False  # sent, answer lost


@dataclass
class Run:
    server: ServerProcess
    http: aiohttp.ClientSession
    saves: list[Save] = field(default_factory=list)
    up: asyncio.Event = field(default_factory=asyncio.Event)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    progress: asyncio.Event = field(default_factory=asyncio.Event)
    acks: int = 0

    def url(self, path: str) -> str:
        return self.server.url + path

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.server.token}"}


def hexhash(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


class Agent:
    """One conversation after another: a ~10-40 kB JSON state growing by a message."""

    def __init__(self, run: Run, n: int) -> None:
        self.run = run
        self.n = n
        self.rng = random.Random(SEED * 100 + n)
        self.thread = 0
        self.msgs: list[dict[str, str]] = []
        self.parent: str | None = None
        self.count = 0
        self._new_thread()

    def _new_thread(self) -> None:
        self.thread += 1
        self.parent = None
        self.msgs = [self._message() for _ in range(20)]

    def _message(self) -> dict[str, str]:
        text = " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randrange(40, 160)))
        return {"role": self.rng.choice(("user", "assistant", "tool")), "content": text}

    async def loop(self) -> None:
        while not self.run.stop.is_set():
            await self.run.up.wait()
            if len(json.dumps(self.msgs)) > 40_000:
                self._new_thread()
            self.msgs.append(self._message())
            self.count += 1
            save = Save(
                f"a{self.n}-{self.count}",
                f"t{self.n}-{self.thread}",
                json.dumps({"messages": self.msgs}).encode(),
                self.parent,
            )
            self.run.saves.append(save)
            header: dict[str, Any] = {
                "metadata": {"attempt": save.key},
                "key": f"small-crash-{save.key}",
                "chunking": "small",
            }
            if save.parent is not None:
                header["parent"] = save.parent
            body = encode_bundle(header, [("state.json", save.state)])
            try:
                async with self.run.http.post(
                    self.run.url(f"/v1/namespaces/{NS}/checkpoints"),
                    data=io.BytesIO(body),
                    headers=self.run.auth,
                ) as resp:
                    raw = await resp.read()
                    if resp.status >= 500:  # starting, or going down
                        save.unknown = True
                        continue
                    assert resp.status in (200, 201), f"{save.key}: {resp.status} {raw[:300]!r}"
                    record = json.loads(raw)
            except TRANSPORT_ERRORS:
                save.unknown = True
                await asyncio.sleep(0)  # the killer restarts the server; `up` says when
                continue
            files = record["files"]
            assert files == {"state.json": {"size": len(save.state), "hash": hexhash(save.state)}}
            save.acked = record["id"]
            self.parent = save.acked
            self.run.acks += 1
            self.run.progress.set()


async def killer(run: Run, rng: random.Random) -> None:
    for _ in range(KILLS):
        target = run.acks + ACKS_PER_ROUND
        while run.acks < target:
            run.progress.clear()
            try:
                await asyncio.wait_for(run.progress.wait(), PROGRESS_TIMEOUT)
            except asyncio.TimeoutError:
                pytest.fail(f"no acknowledged save within {PROGRESS_TIMEOUT}s (seed {SEED})")
        await asyncio.sleep(rng.random() * MAX_KILL_DELAY)
        run.up.clear()
        await asyncio.to_thread(run.server.restart)
        await check_acked(run)
        run.up.set()
    run.stop.set()


async def read_state(run: Run, checkpoint_id: str) -> bytes:
    url = run.url(f"/v1/namespaces/{NS}/checkpoints/{checkpoint_id}/files/state.json")
    async with run.http.get(url, headers=run.auth) as resp:
        assert resp.status == 200, f"{checkpoint_id}: {resp.status}"
        return await resp.read()


async def listed(run: Run) -> dict[str, str]:
    """attempt key -> checkpoint id of every listed checkpoint."""
    out: dict[str, str] = {}
    params = {"limit": "1000"}
    for _ in range(1000):
        async with run.http.get(
            run.url(f"/v1/namespaces/{NS}/checkpoints"), params=params, headers=run.auth
        ) as resp:
            if resp.status == 404:
                return out
            assert resp.status == 200, resp.status
            page = await resp.json()
        for rec in page["checkpoints"]:
            out[rec["metadata"]["attempt"]] = rec["id"]
        if page["next"] is None:
            return out
        params = {"limit": "1000", "before": page["next"]}
    raise AssertionError("checkpoint listing never ended")


async def check_acked(run: Run) -> None:
    """Every acknowledged save is listed and reads back; a save whose answer was lost reads
    back if it is listed."""
    found = await listed(run)
    for save in run.saves:
        if save.acked is not None:
            assert found.get(save.key) == save.acked, f"{save.key} lost (seed {SEED})"
        if save.key in found and (save.acked is not None or save.unknown):
            data = await read_state(run, found[save.key])
            assert data == save.state, f"{save.key} reads back other bytes (seed {SEED})"


@pytest.mark.slow
def test_agent_saves_survive_sigkill(crash_server: ServerProcess) -> None:
    async def main() -> None:
        timeout = aiohttp.ClientTimeout(total=20)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            run = Run(crash_server, http)
            run.up.set()
            agents = [asyncio.ensure_future(Agent(run, n).loop()) for n in range(AGENTS)]
            try:
                await killer(run, random.Random(SEED))
            finally:
                run.stop.set()
                await asyncio.gather(*agents, return_exceptions=True)
            for task in agents:
                if task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            crash_server.restart()
            await check_acked(run)
            acked = [s for s in run.saves if s.acked is not None]
            assert len(acked) >= KILLS * ACKS_PER_ROUND
            assert any(s.parent is not None for s in acked)
            async with http.post(run.url("/v1/admin/gc"), headers=run.auth) as resp:
                assert resp.status == 200
            async with http.post(run.url("/v1/admin/check"), headers=run.auth) as resp:
                report = await resp.json()
            assert report["drift"] == [], report["drift"][:20]
            assert report["missing"] == [], report["missing"][:20]
            assert report["damaged"] == [], report["damaged"][:20]
            assert report["ok"] is True
            async with http.get(run.url("/v1/stats"), headers=run.auth) as resp:
                stats = await resp.json()
            assert stats["codecs"]["delta"]["chunks"] > 0, "no save was stored as a patch"

    asyncio.run(main())
