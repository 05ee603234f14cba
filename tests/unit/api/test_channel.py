"""The channel's framing (node/channel.py): what one end encodes the other decodes, and
anything else is a `ChannelError`, never a guess."""

from __future__ import annotations

import struct

import pytest

from checkpoint_vault.node.channel import (
    HEAD,
    MAX_FRAME,
    TO_WORKER,
    TO_WRITER,
    ChannelError,
    Kind,
    Message,
    decode,
    encode,
    take,
)


def _split(frame: bytes) -> tuple[int, int, bytes]:
    length, call, kind = HEAD.unpack_from(frame)
    assert length == len(frame) - HEAD.size
    return kind, call, frame[HEAD.size :]


def test_fields_and_blobs_come_back_as_sent() -> None:
    sent = Message(Kind.SAVES, 7, {"a": [1, "b"], "c": None}, [b"", b"\x00" * 1000, b"x"])
    kind, call, payload = _split(encode(sent))
    got = decode(kind, call, payload, TO_WRITER)
    assert (got.kind, got.call, got.fields) == (Kind.SAVES, 7, {"a": [1, "b"], "c": None})
    assert [bytes(b) for b in got.blobs] == [b"", b"\x00" * 1000, b"x"]


def test_each_end_takes_only_the_kinds_sent_to_it() -> None:
    assert not TO_WRITER & TO_WORKER
    assert set(Kind) == TO_WRITER | TO_WORKER
    kind, call, payload = _split(encode(Message(Kind.SAVED, 1)))
    with pytest.raises(ChannelError, match="does not take"):
        decode(kind, call, payload, TO_WRITER)
    with pytest.raises(ChannelError, match="kind 99"):
        decode(99, call, payload, TO_WRITER)


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b"", "cut inside a length"),
        (b"\x00\x00", "cut inside a length"),
        (struct.pack(">I", 10) + b"{}", "past the frame's end"),
        (struct.pack(">I", 2) + b"[]", "not a JSON object"),
        (struct.pack(">I", 2) + b"\xff\xfe", "not JSON"),
        (struct.pack(">I", 2) + b"{}" + struct.pack(">I", 5) + b"abc", "past the frame's end"),
        (struct.pack(">I", 2) + b"{}" + b"\x00", "cut inside a length"),
    ],
)
def test_a_malformed_payload_is_refused(payload: bytes, why: str) -> None:
    with pytest.raises(ChannelError, match=why):
        decode(Kind.USES, 1, payload, TO_WRITER)


def test_a_frame_past_the_bound_is_refused_before_its_payload_is_read() -> None:
    buffer = bytearray(HEAD.pack(MAX_FRAME + 1, 1, Kind.SAVES))  # and nothing more
    with pytest.raises(ChannelError, match="bytes"):
        list(take(buffer, TO_WRITER))


def test_whole_frames_are_taken_out_and_a_partial_one_waits() -> None:
    first, second = encode(Message(Kind.USES, 1, {"a": 1})), encode(Message(Kind.USES, 2))
    buffer = bytearray(first + second[:5])
    assert [m.call for m in take(buffer, TO_WRITER)] == [1]
    assert buffer == second[:5]
    buffer += second[5:]
    assert [(m.call, m.fields) for m in take(buffer, TO_WRITER)] == [(2, {})]
    assert not buffer
