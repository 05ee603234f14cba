"""The client cuts exactly where the server does: dedup across producers depends on it."""

from __future__ import annotations

import random

import pytest

from client.chunking import StreamChunker as ClientChunker
from vault.chunking import PROFILES
from vault.chunking import StreamChunker as ServerChunker


@pytest.mark.parametrize("profile", sorted(PROFILES))
@pytest.mark.parametrize("piece", [1000, 65_536, 1 << 20])
def test_client_and_server_chunkers_agree(profile: str, piece: int) -> None:
    data = random.Random(profile + str(piece)).randbytes(3_000_000)
    wire = PROFILES[profile].to_wire()
    client, server = ClientChunker(wire), ServerChunker(PROFILES[profile])
    got_client: list[bytes] = []
    got_server: list[bytes] = []
    for i in range(0, len(data), piece):
        final = i + piece >= len(data)
        got_client += [bytes(c) for c in client.feed(data[i : i + piece], final)]
        got_server += [bytes(c) for c in server.feed(data[i : i + piece], final)]
    assert got_client == got_server
    assert b"".join(got_client) == data
