"""Packs round-trip through every tier, read by range, and refuse damage."""

from __future__ import annotations

import os

import pytest

from checkpoint_vault.vault.content import Packed
from checkpoint_vault.vault.content.packs import (
    PackBuilder,
    decode_index,
    delete_pack,
    encode_index,
    load_index,
    pack_key,
    read_frames,
    upload,
)
from checkpoint_vault.vault.errors import ObjectExists, ObjectNotFound, TierError
from checkpoint_vault.vault.frame import Decoder, Encoder, chunk_id
from checkpoint_vault.vault.tier import Tier


def test_pack_round_trip_by_range(tier: Tier) -> None:
    chunks = [os.urandom(n) for n in (1000, 70_000, 5, 250_000)] + [b"compress me " * 900]
    pack = PackBuilder(target=200_000)
    encoder = Encoder()
    for data in chunks:
        pack.add(chunk_id(data), encoder.encode(data))
    assert pack.full
    upload(tier, pack)
    index = load_index(tier, pack.pack_id)
    assert index == pack.entries
    decoder = Decoder()
    key = pack_key(pack.pack_id)
    wanted = {i: Packed(tier.name, key, e.offset, e.length) for i, e in enumerate(index)}
    frames = read_frames(tier, wanted)
    for i, (data, entry) in enumerate(zip(chunks, index, strict=True)):
        frame = frames[i]
        assert frame is not None
        assert bytes(decoder.plaintext(frame, entry.chunk)) == data
    with pytest.raises(ObjectExists):
        upload(tier, pack)  # a pack id is never reused
    delete_pack(tier, pack.pack_id)
    with pytest.raises(ObjectNotFound):
        load_index(tier, pack.pack_id)


def test_index_damage_and_short_packs_are_errors(tier: Tier) -> None:
    pack = PackBuilder()
    pack.add(chunk_id(b"x"), Encoder().encode(b"x"))
    raw = encode_index(pack.entries)
    with pytest.raises(TierError):
        decode_index(raw[:-1])
    upload(tier, pack)
    entry = pack.entries[0]
    beyond = Packed(tier.name, pack_key(pack.pack_id), entry.offset, entry.length + 10)
    assert read_frames(tier, {0: beyond}) == {0: None}  # the read path calls it damaged
