"""Encryption at rest, on every tier including a real SeaweedFS: what leaves the hot store
is unreadable without the key, names nothing, and a flipped byte is caught."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.tiering.repack import repack
from checkpoint_vault.vault import (
    ChunkCorrupt,
    FakeClock,
    InvalidRequest,
    Keyring,
    Vault,
    VaultConfig,
)
from checkpoint_vault.vault.errors import KeyUnavailable
from checkpoint_vault.vault.seal import add_key
from checkpoint_vault.vault.tier import Tier

from ..unit.vault.helpers import read_file, stream_save

# Text compresses: the frames are zstd inside the seal, so the plaintext must be found
# neither raw nor as its compressed form; a marker per 200 bytes makes either obvious.
SECRET = b"".join(
    b"patient-record-%06d " % i + random.Random(i).randbytes(180) for i in range(2000)
)


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys"
    add_key(path)
    return path


def _open(path: Path, tier: Tier, keys: Path | None) -> Vault:
    keyring = Keyring.load(keys) if keys is not None else None
    return Vault(path, VaultConfig(gc_grace=0.0), FakeClock(), {tier.name: tier}, keyring)


@pytest.fixture
def sealed(tmp_path: Path, tier: Tier, key_file: Path) -> Iterator[tuple[Vault, list[bytes]]]:
    vault = _open(tmp_path / "v", tier, key_file)
    rec = stream_save(vault, "ns", {"records.bin": SECRET})
    _, files = vault.manifest("ns", rec.id)
    chunks = [c for c, _ in files["records.bin"].chunks]
    assert vault.content.demote(tier.name, chunks).chunks_moved == len(set(chunks))
    yield vault, chunks
    vault.close()


def _objects(tier: Tier) -> dict[str, bytes]:
    return {key: tier.get(key) for key in tier.list("")}


def test_objects_reveal_neither_bytes_nor_chunk_ids(
    sealed: tuple[Vault, list[bytes]], tier: Tier
) -> None:
    vault, chunks = sealed
    objects = _objects(tier)
    assert len(objects) == 2  # one pack and its index
    for key, body in objects.items():
        assert b"patient-record" not in body
        for cid in chunks:
            assert cid not in body
            assert cid.hex() not in key
    assert read_file(vault, "ns", "latest", "records.bin") == SECRET


def test_without_the_key_cold_chunks_are_unavailable_not_damaged(
    sealed: tuple[Vault, list[bytes]], tier: Tier, tmp_path: Path
) -> None:
    vault, chunks = sealed
    vault.close()
    keyless = _open(tmp_path / "v", tier, None)
    try:
        with pytest.raises(KeyUnavailable):
            read_file(keyless, "ns", "latest", "records.bin")
        keyless.store.writer.run(lambda w: None)  # any flag the read queued has landed
        assert keyless.check().damaged == []
    finally:
        keyless.close()


def test_a_different_key_under_the_same_id_is_refused_at_open(
    sealed: tuple[Vault, list[bytes]], tier: Tier, tmp_path: Path
) -> None:
    vault, _ = sealed
    vault.close()
    other = tmp_path / "other-keys"
    add_key(other)  # also key 1, but another key
    with pytest.raises(InvalidRequest, match="not the key 1"):
        _open(tmp_path / "v", tier, other)


def test_a_flipped_byte_in_a_pack_is_detected_as_damage(
    sealed: tuple[Vault, list[bytes]], tier: Tier
) -> None:
    vault, chunks = sealed
    (pack_key,) = [k for k in tier.list("packs/") if not k.endswith(".idx")]
    body = bytearray(tier.get(pack_key))
    body[len(body) // 2] ^= 0x01
    tier.put(pack_key, bytes(body))
    with pytest.raises(ChunkCorrupt):
        read_file(vault, "ns", "latest", "records.bin")
    report = vault.verify()
    assert len(report.corrupt) == 1  # exactly the chunk whose ciphertext changed
    assert vault.get("ns", "latest").validity.state == "invalid"


def test_keys_rotate_old_data_stays_readable(
    sealed: tuple[Vault, list[bytes]], tier: Tier, tmp_path: Path, key_file: Path
) -> None:
    vault, _ = sealed
    first = vault.get("ns", "latest")
    vault.close()
    assert add_key(key_file) == 2
    rotated = _open(tmp_path / "v", tier, key_file)
    try:
        assert rotated.store.keyring is not None
        assert rotated.store.keyring.active == 2
        more = random.Random(9).randbytes(150_000)
        rec = stream_save(rotated, "ns", {"more.bin": more})
        _, files = rotated.manifest("ns", rec.id)
        rotated.content.demote(tier.name, [c for c, _ in files["more.bin"].chunks])
        assert read_file(rotated, "ns", rec.id, "more.bin") == more
        assert read_file(rotated, "ns", first.id, "records.bin") == SECRET
    finally:
        rotated.close()


def test_key_files_are_checked(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.write_text(f"1 {'ab' * 32}\n")
    loose.chmod(0o644)
    with pytest.raises(InvalidRequest, match="chmod 600"):
        Keyring.load(loose)
    bad = tmp_path / "bad"
    bad.write_text("1 tooshort\n")
    bad.chmod(0o600)
    with pytest.raises(InvalidRequest, match="line 1"):
        Keyring.load(bad)


def test_repacking_everything_retires_the_old_key(
    sealed: tuple[Vault, list[bytes]], tier: Tier, tmp_path: Path, key_file: Path
) -> None:
    vault, _ = sealed
    vault.close()
    add_key(key_file)
    rotated = _open(tmp_path / "v", tier, key_file)
    try:
        report = repack(rotated, below=1.0)
        assert (report.rewritten, report.deleted, report.new_packs) == (1, 1, 1)
    finally:
        rotated.close()
    newest_only = tmp_path / "key-2-only"
    newest_only.write_text(key_file.read_text().splitlines()[-1] + "\n")
    newest_only.chmod(0o600)
    retired = _open(tmp_path / "v", tier, newest_only)
    try:
        assert read_file(retired, "ns", "latest", "records.bin") == SECRET
    finally:
        retired.close()
