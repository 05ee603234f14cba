"""Verification finds bytes flipped on disk, invalidates exactly the affected checkpoints,
and a re-upload of the same bytes heals them."""

from __future__ import annotations

import random
from pathlib import Path

from checkpoint_vault.vault import Vault, VaultConfig
from checkpoint_vault.vault.clock import FakeClock

from .helpers import read_file, stream_save


def flip_on_disk(data_file: Path, needle: bytes) -> None:
    """Flip one byte of `needle` wherever it is in an LMDB data file (copy-on-write can
    leave stale copies on free pages; flipping those too changes nothing live)."""
    blob = bytearray(data_file.read_bytes())
    at = blob.find(needle)
    assert at >= 0, "chunk bytes not found on disk"
    while at >= 0:
        blob[at + len(needle) // 2] ^= 0x55
        at = blob.find(needle, at + 1)
    data_file.write_bytes(bytes(blob))


def test_verify_finds_flipped_bytes_invalidates_and_heals(tmp_path: Path) -> None:
    rng = random.Random(9)
    shared, other = rng.randbytes(300_000), rng.randbytes(200_000)
    clock = FakeClock()
    vault = Vault(tmp_path / "v", VaultConfig(), clock)
    safe = stream_save(vault, "ns", {"other": other})
    first = stream_save(vault, "ns", {"w": shared})
    second = stream_save(vault, "ns", {"w": shared, "x": b"extra"})
    producer_marked = stream_save(vault, "ns", {"w": shared + b"tail"})
    _, files = vault.manifest("ns", first.id)
    victim_id, _ = files["w"].chunks[1]
    victim = b"".join(vault.reader.chunks([victim_id]))
    vault.close()

    flip_on_disk(tmp_path / "v" / "frames" / "data.mdb", victim[1000:1064])

    vault = Vault(tmp_path / "v", VaultConfig(), clock)
    report = vault.verify()
    assert report.corrupt == [victim_id.hex()]
    assert sorted(report.checkpoints_invalidated) == sorted(
        [first.id, second.id, producer_marked.id]
    )
    assert report.chunks_checked == vault.stats().chunks
    rec = vault.get("ns", first.id)
    assert rec.validity.state == "invalid"
    assert rec.validity.reason == f"corrupt chunk {victim_id.hex()}"
    assert rec.validity.source == "scrub"
    assert vault.get("ns", "latest-valid").id == safe.id
    vault.lifecycle.patch("ns", producer_marked.id, validity={"state": "invalid", "reason": "NaN"})

    session, _ = vault.open_upload("ns")
    assert vault.uploads.missing(session.id, [victim_id.hex()]) == [victim_id.hex()]
    assert vault.uploads.put_chunk(session.id, victim_id.hex(), victim)
    healed = vault.verify()
    assert healed.corrupt == []
    assert sorted(healed.checkpoints_healed) == sorted([first.id, second.id])
    assert vault.get("ns", "latest-valid").id == second.id
    assert vault.get("ns", producer_marked.id).validity.reason == "NaN"
    assert read_file(vault, "ns", first.id, "w") == shared
    assert vault.check().ok
    vault.close()


def test_sample_and_namespace_limit_what_is_read(vault: Vault) -> None:
    for i in range(4):
        stream_save(vault, f"ns{i % 2}", {"f": random.Random(i).randbytes(200_000)})
    everything = vault.verify()
    half = vault.verify(sample=0.5)
    only_ns0 = vault.verify(namespace="ns0")
    assert 0 < half.chunks_checked < everything.chunks_checked
    assert 0 < only_ns0.chunks_checked < everything.chunks_checked
    assert everything.corrupt == []


def test_verify_finds_every_damaged_chunk_in_both_stores(tmp_path: Path) -> None:
    rng = random.Random(10)
    clock = FakeClock()
    vault = Vault(tmp_path / "v", VaultConfig(), clock)
    big = [stream_save(vault, "tensors", {"w": rng.randbytes(400_000)}) for _ in range(3)]
    agent, _ = vault.save("agent", {"state.json": rng.randbytes(20_000)}, chunking="small")
    victims: list[tuple[bytes, bytes, str]] = []  # (chunk, bytes, store) to damage
    for rec in big:
        _, files = vault.manifest("tensors", rec.id)
        cid = files["w"].chunks[2][0]
        victims.append((cid, b"".join(vault.reader.chunks([cid])), "frames"))
    _, files = vault.manifest("agent", agent.id)
    cid = files["state.json"].chunks[1][0]
    victims.append((cid, b"".join(vault.reader.chunks([cid])), "catalog"))
    vault.close()
    for _, data, where in victims:
        flip_on_disk(tmp_path / "v" / where / "data.mdb", data[100:164])

    vault = Vault(tmp_path / "v", VaultConfig(), clock)
    report = vault.verify()
    assert sorted(report.corrupt) == sorted(c.hex() for c, _, _ in victims)
    assert sorted(report.checkpoints_invalidated) == sorted([r.id for r in big] + [agent.id])
    check = vault.check()
    assert sorted(check.damaged) == sorted(c.hex() for c, _, _ in victims)
    vault.close()
