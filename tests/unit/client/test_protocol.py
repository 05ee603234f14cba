"""The wire records round-trip, reject malformed JSON, and the one chunker takes a profile
either as the server's object or as the wire form an upload answer carries."""

from __future__ import annotations

import random

import pytest

from checkpoint_vault.client.models import Checkpoint
from checkpoint_vault.protocol import (
    CheckpointRecord,
    ChunkingProfile,
    ChunkSpan,
    FileInfo,
    Manifest,
    ManifestFile,
    StreamChunker,
    TombstoneRecord,
    Validity,
    format_duration,
    lineage_entry_from_wire,
    parse_duration,
    parse_size,
)
from checkpoint_vault.vault.chunking import PROFILES


def test_checkpoint_round_trips() -> None:
    rec = CheckpointRecord(
        "c1", "ns", None, "2026-01-01T00:00:00Z", {"step": 3}, ["a"], True,
        Validity("valid", "ok", "producer", "2026-01-01T00:00:01Z"), {"f": FileInfo(3, "ab")},
        3, "warm",
    )  # fmt: skip
    assert CheckpointRecord.from_wire(rec.to_wire()) == rec
    client = Checkpoint.from_wire(rec.to_wire())
    assert client.files == {"f": FileInfo(3, "ab")}
    assert client.valid is True


def test_tombstones_are_told_apart_by_deleted() -> None:
    t = TombstoneRecord("c1", "ns", "c0", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z")
    assert lineage_entry_from_wire(t.to_wire()) == t
    assert Checkpoint.from_wire(t.to_wire()).deleted


def test_manifest_round_trips() -> None:
    m = Manifest("c1", {"f": ManifestFile(5, "ab", [ChunkSpan("00", 0, 5)])})
    assert Manifest.from_wire(m.to_wire()) == m


@pytest.mark.parametrize(
    "bad",
    [{}, {"id": 1, "namespace": "n"}, {"id": "i", "namespace": "n", "tags": "x"}, []],
)
def test_malformed_records_are_value_errors(bad: object) -> None:
    with pytest.raises(ValueError, match="CheckpointRecord"):
        CheckpointRecord.from_wire(bad)


def test_validity_state_is_checked() -> None:
    with pytest.raises(ValueError, match="Validity.state"):
        Validity.from_wire({"state": "maybe"})


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_chunker_from_the_wire_form_cuts_like_the_profile(profile: str) -> None:
    data = random.Random(profile).randbytes(1_000_000)
    wire = PROFILES[profile].to_wire()
    assert ChunkingProfile.from_wire(wire) == PROFILES[profile]
    a, b = StreamChunker(wire), StreamChunker(PROFILES[profile])
    got_a = [
        bytes(c)
        for i in range(0, len(data), 65_536)
        for c in a.feed(data[i : i + 65_536], i + 65_536 >= len(data))
    ]
    got_b = [bytes(c) for c in b.feed(data, True)]
    assert got_a == got_b
    assert b"".join(got_a) == data


def test_unknown_chunking_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported chunking"):
        StreamChunker({"algorithm": "rabin", "min_size": 1, "avg_size": 2, "max_size": 3})


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("90s", 90), ("36h", 129600), ("7d", 604800), ("2w", 1209600),
     ("1.5m", 90), ("90", 90), (" 5 s ", 5), (12, 12), (0.25, 0.25)],
)  # fmt: skip
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["soon", "-5s", "5x", True, -1, None, "5 ms s"])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(bad)


@pytest.mark.parametrize(
    ("text", "size"),
    [("4194304", 4194304), ("512MiB", 512 << 20), ("40 GiB", 40 << 30), (7, 7), ("3B", 3)],
)
def test_sizes(text: object, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["1.5GiB", "5GB", -1, True, "many"])
def test_bad_sizes(bad: object) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(bad)


@pytest.mark.parametrize("seconds", [0.5, 90, 129600, 604800, 86400 * 2.5])
def test_formatted_durations_parse_back(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == seconds
