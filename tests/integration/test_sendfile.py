"""Downloads of raw hot frames are copied out of the data file under a read transaction and
sent from that copy by a sender thread: the bytes must still be exactly the file's, ranges
included, and nothing may stay held after a client goes away or a frame turns out damaged.
(tests/integration/test_download_reuse.py replays why they are no longer sent with
sendfile.)"""

from __future__ import annotations

import asyncio
import os
import random

import aiohttp
import pytest

from checkpoint_vault.api.keys import VAULT
from checkpoint_vault.api.transfer import download
from checkpoint_vault.vault import Vault

from ..conftest import Api
from ..unit.vault.helpers import flip_last_byte

MiB = 1 << 20


def _vault(api: Api) -> Vault:
    vault: Vault = api.client.app[VAULT]
    return vault


class _Room:
    """The buffer a copy asks for, kept to see which parts were copied into it."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def __call__(self, size: int) -> bytearray:
        self.buf = bytearray(size)
        return self.buf


async def _readers_gone(vault: Vault) -> None:
    """Bounded: the server notices a dropped connection within a few loop turns."""
    for _ in range(400):
        if vault.store.frames_env.readers == 0:
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"{vault.store.frames_env.readers} read transactions still open")


async def test_raw_hot_files_leave_pinned_and_read_back_exactly(api: Api) -> None:
    data = os.urandom(9 * MiB)  # three read batches
    rec = await api.save("sf", {"w": data})
    vault = _vault(api)
    _, files = vault.manifest("sf", rec["id"])
    room = _Room()
    copied = vault.reader.copied([c for c, _ in files["w"].chunks], room)
    assert copied is not None, "the chunks of a streamed random file are raw hot frames"
    assert all(isinstance(p, memoryview) and p.obj is room.buf for p in copied)
    assert b"".join(copied) == data
    assert vault.store.frames_env.readers == 0, "nothing held once copied"
    assert await api.read("sf", rec["id"], "w") == data
    for first, last in [(0, 0), (4 * MiB - 3, 4 * MiB + 5), (5 * MiB, 9 * MiB - 1)]:
        got = await api.read("sf", rec["id"], "w", headers={"Range": f"bytes={first}-{last}"})
        assert got == data[first : last + 1]
    await _readers_gone(vault)


async def test_batches_mixing_raw_and_compressed_frames_read_back_exactly(api: Api) -> None:
    """Compressible stretches are zstd frames, sent as plaintext between sendfile calls."""
    rng = random.Random(3)
    data = b"".join(
        rng.randbytes(300_000) if i % 2 else bytes(300_000) + rng.randbytes(100) for i in range(20)
    )
    rec = await api.save("mix", {"w": data})
    vault = _vault(api)
    _, files = vault.manifest("mix", rec["id"])
    room = _Room()
    copied = vault.reader.copied([c for c, _ in files["w"].chunks], room)
    assert copied is not None
    kinds = {isinstance(p, memoryview) and p.obj is room.buf for p in copied}
    assert b"".join(copied) == data
    assert kinds == {True, False}, "both raw frames copied and decoded plaintexts in one batch"
    assert await api.read("mix", rec["id"], "w") == data
    for first, last in [(299_990, 300_010), (1_000_000, 4_500_000), (len(data) - 7, len(data) - 1)]:
        got = await api.read("mix", rec["id"], "w", headers={"Range": f"bytes={first}-{last}"})
        assert got == data[first : last + 1]
    await _readers_gone(vault)


async def test_a_client_gone_mid_download_lets_go_of_the_pages(api: Api) -> None:
    data = os.urandom(16 * MiB)
    rec = await api.save("gone", {"w": data})
    resp = await api.call("GET", f"/v1/namespaces/gone/checkpoints/{rec['id']}/files/w")
    assert resp.status == 200
    assert await resp.content.readexactly(MiB) == data[:MiB]
    resp.close()  # drops the connection with most of the file unsent
    vault = _vault(api)
    await _readers_gone(vault)
    await asyncio.wait_for(asyncio.to_thread(vault.store.frames_env.grow), 30)
    assert await api.read("gone", rec["id"], "w") == data  # and the grown map still serves


@pytest.mark.slow
async def test_a_client_that_stops_reading_is_cut_off(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(download, "STALL_SECONDS", 0.5)
    data = os.urandom(64 * MiB)  # far more than the socket buffers on both sides hold
    rec = await api.save("stall", {"w": data})
    resp = await api.call("GET", f"/v1/namespaces/stall/checkpoints/{rec['id']}/files/w")
    assert resp.status == 200
    assert await resp.content.readexactly(MiB) == data[:MiB]
    vault = _vault(api)
    await _readers_gone(vault)  # nothing held even while the client reads nothing
    runner = api.client.server.runner
    assert runner is not None
    assert runner.server is not None
    server = runner.server
    for _ in range(400):  # bounded: the sender gives up after STALL_SECONDS without room
        if not server.connections:
            break
        await asyncio.sleep(0.025)
    assert not server.connections, "a client that reads nothing is cut off"
    with pytest.raises(aiohttp.ClientError):
        await resp.read()  # what was buffered, then the cut
    resp.close()
    assert await api.read("stall", rec["id"], "w") == data


async def test_a_frame_damaged_in_place_is_never_sent(api: Api) -> None:
    data = os.urandom(9 * MiB)
    rec = await api.save("bad", {"w": data})
    vault = _vault(api)
    _, files = vault.manifest("bad", rec["id"])
    chunks = files["w"].chunks
    victim, offset = chunks[-1][0], sum(n for _, n in chunks[:-1])  # in the last batch
    flip_last_byte(vault, victim)
    resp = await api.call("GET", f"/v1/namespaces/bad/checkpoints/{rec['id']}/files/w")
    assert resp.status == 200  # the first batch was sound: the status went out
    with pytest.raises(aiohttp.ClientError):
        await resp.read()  # cut short before the damaged chunk, never its bytes
    resp.close()
    await _readers_gone(vault)
    up = await api.open("bad")
    missing = await api.json(
        "POST", f"/v1/uploads/{up['upload_id']}/missing", json={"chunks": [victim.hex()]}
    )
    assert missing["missing"] == [victim.hex()]
    assert offset > 4 * MiB
