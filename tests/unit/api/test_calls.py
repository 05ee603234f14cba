"""The calls channel's messages (node/calls.py): prepared saves, outcomes and errors encoded
field by field and decoded strictly, errors coming back as the engine's own classes."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from checkpoint_vault.node.calls import (
    CallServer,
    error_fields,
    error_of,
    outcomes_of,
    prepared_saves,
    saved_message,
    saves_message,
)
from checkpoint_vault.node.channel import (
    HEAD,
    TO_WORKER,
    TO_WRITER,
    ChannelError,
    Kind,
    Message,
    decode,
    encode,
)
from checkpoint_vault.vault import (
    DEFAULT_PROFILE,
    FileEntry,
    PreparedSave,
    StoredCheckpoint,
    Vault,
)
from checkpoint_vault.vault.direct import SaveRequest
from checkpoint_vault.vault.errors import (
    CheckpointNotFound,
    MissingChunks,
    NotFound,
    QuotaExceeded,
    VaultError,
)


def _over(message: Message, accepted: frozenset[Kind]) -> Message:
    frame = encode(message)
    _, call, kind = HEAD.unpack_from(frame)
    return decode(kind, call, frame[HEAD.size :], accepted)


def _save(n: int) -> PreparedSave:
    files = {"state.json": b"s" * (100 + n), "w.bin": bytes(range(256)) * n}
    entries = {
        name: FileEntry(len(data), bytes([n]) * 32, ((bytes([n, 1]) * 16, len(data)),))
        for name, data in files.items()
    }
    request = SaveRequest(
        f"ns{n}", files, None if n else "latest", bool(n), {"step": n, "x": [1.5, None]},
        ["t"], f"key-{n}", "trainer", DEFAULT_PROFILE,
    )  # fmt: skip
    return PreparedSave(request, entries, {bytes([n, 1]) * 16: b"frame" * n})


def test_prepared_saves_come_back_equal() -> None:
    saves = [_save(0), _save(1), _save(3)]
    assert prepared_saves(_over(saves_message(5, saves), TO_WRITER)) == saves


def test_a_save_batch_missing_or_adding_parts_is_refused() -> None:
    message = saves_message(1, [_save(2)])
    with pytest.raises(ChannelError, match="missing parts"):
        prepared_saves(Message(message.kind, 1, message.fields, message.blobs[:-1]))
    with pytest.raises(ChannelError, match="left over"):
        prepared_saves(Message(message.kind, 1, message.fields, [*message.blobs, b""]))
    bad = dict(message.fields["saves"][0], profile={"name": "x", "min_size": "1"})
    with pytest.raises(ChannelError, match="chunking profile"):
        prepared_saves(Message(message.kind, 1, {"saves": [bad]}, message.blobs))
    entry_at = 2  # after the two files
    for cut in (b"", bytes(message.blobs[entry_at])[:-1], bytes(message.blobs[entry_at]) + b"x"):
        blobs = list(message.blobs)
        blobs[entry_at] = cut
        with pytest.raises(ChannelError, match="file entry"):
            prepared_saves(Message(message.kind, 1, message.fields, blobs))
    bad = dict(message.fields["saves"][0], tags="t")
    with pytest.raises(ChannelError, match="'tags' is a str"):
        prepared_saves(Message(message.kind, 1, {"saves": [bad]}, message.blobs))


def test_outcomes_come_back_as_records_and_the_engines_errors() -> None:
    record = StoredCheckpoint("01ab", "ns", None, 1.25, {"m": 1}, ["t"], {}, 10)
    outcomes: list[tuple[StoredCheckpoint, bool] | Exception] = [
        (record, True),
        CheckpointNotFound("no such checkpoint"),
        MissingChunks(["aa", "bb"]),
        (record, False),
        QuotaExceeded("over"),
    ]
    saves = [_save(1)] * len(outcomes)  # inheriting: its records carry their files
    back = outcomes_of(_over(saved_message(9, outcomes, saves), TO_WORKER), saves)
    assert back[0] == (record, True)
    assert back[3] == (record, False)
    assert type(back[1]) is CheckpointNotFound
    assert str(back[1]) == "no such checkpoint"
    assert isinstance(back[1], NotFound)
    assert isinstance(back[1], KeyError)
    assert type(back[2]) is MissingChunks
    assert back[2].details() == {"missing": ["aa", "bb"]}
    assert type(back[4]) is QuotaExceeded
    assert back[4].status == QuotaExceeded.status


def test_a_new_checkpoint_comes_back_without_its_files_and_the_worker_fills_them() -> None:
    fresh, inheriting = _save(2), _save(3)
    fresh = PreparedSave(replace(fresh.request, inherit=False), fresh.entries, fresh.frames)
    records = [
        StoredCheckpoint(f"01a{n}", p.request.ns, None, 1.5, {}, [], {}, 10 * n)
        for n, p in enumerate((fresh, inheriting, fresh))
    ]
    for record, p in zip(records, (fresh, inheriting, fresh), strict=True):
        record.set_files(p.entries)
    outcomes: list[tuple[StoredCheckpoint, bool] | Exception] = [
        (records[0], True),
        (records[1], True),
        (records[2], False),  # a retry's: the record as the catalog holds it
    ]
    saves = [fresh, inheriting, fresh]
    message = _over(saved_message(4, outcomes, saves), TO_WORKER)
    assert [d.get("elided", False) for d in message.fields["outcomes"]] == [True, False, False]
    assert b"hash" not in bytes(message.blobs[0])  # the files stayed out of the frame
    assert outcomes_of(message, saves) == outcomes
    with pytest.raises(ChannelError, match="3 outcomes for 2 saves"):
        outcomes_of(message, saves[:2])


def test_an_error_names_no_class_outside_the_engines_tree() -> None:
    bug = error_of(error_fields(ZeroDivisionError("x")))
    assert type(bug) is VaultError
    assert bug.code == "internal"
    forged = error_of({"code": "not_found", "type": "Popen", "message": "m"})
    assert type(forged) is NotFound
    unknown = error_of({"code": "nope", "type": "os.system", "message": "m"})
    assert type(unknown) is VaultError
    with pytest.raises(ChannelError):
        error_of({"code": 1, "type": "x", "message": "m"})


def test_small_files_left_to_the_writer_cross_with_their_bases_and_nothing_else() -> None:
    """`patch_here`: the one-chunk files a worker could not patch (it lacks the base) go
    over with their bases' ids; one naming a chunk of no one-chunk file is refused."""
    save = _save(2)
    cid = save.entries["state.json"].chunks[0][0]
    left = PreparedSave(save.request, save.entries, {}, {cid: b"b" * 32})
    assert prepared_saves(_over(saves_message(3, [left]), TO_WRITER)) == [left]
    message = saves_message(3, [left])
    for bad in ({"00" * 32: "bb" * 32}, {cid.hex(): "bb"}, {cid.hex(): "zz" * 32}):
        fields = dict(message.fields["saves"][0], patch_here=bad)
        with pytest.raises(ChannelError, match="patch_here"):
            prepared_saves(Message(message.kind, 1, {"saves": [fields]}, message.blobs))


def test_the_writing_end_answers_every_frame_of_one_read_and_closes_on_a_bad_one(
    tmp_path: Path, vault: Vault
) -> None:
    """Frames arriving together are each answered (the protocol takes every whole frame a
    read brings, a cut one waits for its rest); a frame that does not decode ends the
    connection, with nothing after it taken."""
    uses: list[dict[str, float]] = []
    server = CallServer(vault, uses.append)

    async def go() -> None:
        path = str(tmp_path / "calls.sock")
        listening = await asyncio.get_running_loop().create_unix_server(
            server.connection, path=path
        )
        async with listening:
            reader, writer = await asyncio.open_unix_connection(path)
            one, two = (
                encode(Message(Kind.USES, n, {"last_used": {f"t{n}": 1.5}})) for n in (1, 2)
            )
            writer.write(one + two[:7])
            await writer.drain()
            assert await _answer(reader) == (Kind.NOTED, 1)
            writer.write(two[7:])
            assert await _answer(reader) == (Kind.NOTED, 2)
            writer.write(HEAD.pack(5, 3, 250) + b"xxxxx" + two)  # a kind nobody sends
            assert await reader.read() == b""  # closed, the frame after it not answered
            writer.close()

    asyncio.run(go())
    assert uses == [{"t1": 1.5}, {"t2": 1.5}]


def _uses(call: int) -> bytes:
    return encode(Message(Kind.USES, call, {"last_used": {f"t{call}": 1.5}}))


async def _answer(reader: asyncio.StreamReader) -> tuple[Kind, int]:
    length, call, kind = HEAD.unpack_from(await reader.readexactly(HEAD.size))
    message = decode(kind, call, await reader.readexactly(length), TO_WORKER)
    return message.kind, message.call
