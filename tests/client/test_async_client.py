"""The async face against a real server: the same operations as the blocking one."""

from __future__ import annotations

import asyncio
import io
import random

import pytest

from checkpoint_vault.client import AsyncVaultClient, NotFound

from ..serverproc import ServerProcess

BOTH_TRANSPORTS = True  # conftest: a server with its local socket on, and off


async def test_open_is_a_seekable_async_file(server: ServerProcess) -> None:
    data = random.Random(7).randbytes(9 << 20)
    async with AsyncVaultClient(server.url, server.token, progress=False) as vault:
        ckpt = await vault.save("a/open", {"w.bin": data})
        async with vault.open("a/open", "latest", "w.bin") as f:
            assert f.size == len(data)
            assert await f.read(10) == data[:10]
            before = vault.transfer.requests
            pieces = [await f.read(256 << 10) for _ in range(8)]  # continues one stream
            assert b"".join(pieces) == data[10 : 10 + (2 << 20)]
            assert vault.transfer.requests == before
            f.seek(-5, io.SEEK_END)
            assert f.tell() == len(data) - 5
            assert await f.read() == data[-5:]
            f.seek(3 << 20)
            assert await f.read(100) == data[3 << 20 : (3 << 20) + 100]
            f.seek(0)
            assert await f.read() == data
        assert f.closed
        f2 = await vault.open("a/open", ckpt.id, "w.bin")
        await vault.save("a/open", {"w.bin": b"newer"})  # the open file keeps its checkpoint
        assert await f2.read(4) == data[:4]
        await f2.close()
        with pytest.raises(NotFound):
            await vault.open("a/open", ckpt.id, "absent")


async def test_background_saves_and_submit_timeout(server: ServerProcess) -> None:
    gate = asyncio.Event()
    async with AsyncVaultClient(server.url, server.token, progress=False) as vault:

        async def held() -> object:
            await gate.wait()
            return await vault.save("a/bg", {"x": b"held"})

        first = await vault.submit(lambda: held())  # type: ignore[arg-type,return-value]
        with pytest.raises(TimeoutError):  # the one slot is taken
            await vault.submit(lambda: held(), timeout=0.1)  # type: ignore[arg-type,return-value]
        gate.set()
        await first
        handle = await vault.save("a/bg", {"x": b"later"}, background=True, tags=["bg"])
        ckpt = await handle
        assert ckpt.tags == ["bg"]
        await vault.flush()
