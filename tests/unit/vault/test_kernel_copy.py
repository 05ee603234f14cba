"""Restores into a file on the data file's own file system are copied by the kernel
(`Reader.copy_into`, vault/deliver.py): the bytes come out identical, a damaged frame is
caught by the hash taken under the same pin, and a file elsewhere takes the usual copy."""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

import pytest

from vault import Vault
from vault.errors import ChunkCorrupt
from vault.manifest import FileEntry

from .helpers import flip_last_byte, stream_save


def _entry(vault: Vault, data: bytes) -> FileEntry:
    rec = stream_save(vault, "ns", {"w": data})
    _, files = vault.manifest("ns", rec.id)
    return files["w"]


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)


@pytest.fixture
def big(tmp_path: Path) -> Vault:
    vault = Vault(tmp_path / "v")
    yield vault  # type: ignore[misc]
    vault.close()


def test_raw_frames_are_copied_by_the_kernel_and_verified(big: Vault, tmp_path: Path) -> None:
    data = random.Random(5).randbytes(6_000_000)  # raw frames: random bytes do not compress
    entry = _entry(big, data)
    cids = [c for c, _ in entry.chunks]
    fd = _open(tmp_path / "copy")
    try:
        assert big.reader.copy_into(cids, fd, 0) == len(data)
    finally:
        os.close(fd)
    assert (tmp_path / "copy").read_bytes() == data
    big.deliver_descriptor(entry, _open(tmp_path / "restored"))
    assert (tmp_path / "restored").read_bytes() == data


def test_a_damaged_frame_is_not_delivered(big: Vault, tmp_path: Path) -> None:
    data = random.Random(6).randbytes(3_000_000)
    entry = _entry(big, data)
    victim = entry.chunks[3][0]
    flip_last_byte(big, victim)
    fd = _open(tmp_path / "copy")
    try:
        assert big.reader.copy_into([c for c, _ in entry.chunks], fd, 0) is None
    finally:
        os.close(fd)
    with pytest.raises(ChunkCorrupt):
        big.deliver_descriptor(entry, _open(tmp_path / "restored"))
    big.store.writer.wait_durable()  # the flag is written behind the read, in commit order
    assert big.check().damaged == [victim.hex()]


def test_a_file_on_another_file_system_takes_the_usual_copy(big: Vault, tmp_path: Path) -> None:
    if not Path("/dev/shm").is_dir() or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a file system of its own")
    data = random.Random(7).randbytes(3_000_000)
    entry = _entry(big, data)
    with tempfile.TemporaryDirectory(dir="/dev/shm") as elsewhere:
        path = Path(elsewhere) / "restored"
        fd = _open(path)
        try:
            assert big.reader.copy_into([c for c, _ in entry.chunks], fd, 0) is None
        finally:
            os.close(fd)
        big.deliver_descriptor(entry, _open(path))
        assert path.read_bytes() == data
