"""Storage samples (vault/samples.py): kept in time order, bounded by count and by age in
the transaction that appends, read back oldest first, and surviving a reopen."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpoint_vault import maintenance
from checkpoint_vault.vault import FakeClock, InvalidRequest, Vault, VaultConfig
from checkpoint_vault.vault.samples import (
    NamespaceBytes,
    StorageSample,
    StorageSamples,
    allocated_bytes,
)

from .helpers import stream_save


def sample(at: float, n: int = 0) -> StorageSample:
    return StorageSample(at, 100 * n, 10 * n, 4096 * n, {"team/a": NamespaceBytes(100 * n, 10 * n)})


def test_history_is_oldest_first_and_filters_by_time_and_count(vault: Vault) -> None:
    samples = StorageSamples(vault.store)
    assert samples.history() == []
    assert samples.newest() is None
    for i in range(5):
        samples.append(sample(1000.0 + i, i))
    assert [s.at for s in samples.history()] == [1000.0, 1001.0, 1002.0, 1003.0, 1004.0]
    assert [s.at for s in samples.history(limit=2)] == [1003.0, 1004.0]  # the newest two
    assert [s.at for s in samples.history(since=1003.0)] == [1003.0, 1004.0]
    assert samples.newest() == sample(1004.0, 4)  # every field round-trips
    with pytest.raises(InvalidRequest):
        samples.history(limit=0)


def test_the_table_is_bounded_by_count_and_by_age(vault: Vault) -> None:
    samples = StorageSamples(vault.store, max_samples=3, max_age=100.0)
    for i in range(5):
        samples.append(sample(1000.0 + i, i))
    assert [s.at for s in samples.history()] == [1002.0, 1003.0, 1004.0]
    samples.append(sample(1150.0, 9))  # everything before 1050 is too old now
    assert [s.at for s in samples.history()] == [1150.0]


def test_samples_survive_a_reopen(tmp_path: Path) -> None:
    clock = FakeClock()
    config = VaultConfig(map_size=1 << 20)
    v = Vault(tmp_path / "v", config, clock)
    StorageSamples(v.store).append(sample(1234.5, 2))
    v.close()
    v = Vault(tmp_path / "v", config, clock)
    try:
        assert StorageSamples(v.store).history() == [sample(1234.5, 2)]
    finally:
        v.close()


def test_allocated_bytes_counts_blocks_as_du_does(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "f").write_bytes(b"x" * 10_000)
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(1 << 30)  # a 1 GiB hole takes (almost) nothing
    found = allocated_bytes(tmp_path)
    assert 10_000 <= found < 1 << 20


def test_every_usage_scan_takes_a_sample_and_the_usage_task_answers_it(vault: Vault) -> None:
    stream_save(vault, "team/a", {"w": b"q" * 200_000})
    usage = vault.usage()
    [first] = vault.samples.history()
    assert first.namespaces["team/a"] == NamespaceBytes(
        usage["team/a"].logical_bytes, usage["team/a"].stored_bytes
    )
    assert first.logical_bytes == vault.stats().logical_bytes
    assert first.disk_bytes is not None  # what du counts, LMDB's sparse maps as written
    assert 100_000 < first.disk_bytes <= allocated_bytes(vault.path)
    vault.store.clock.advance(60)  # type: ignore[attr-defined]
    second = maintenance.usage(vault)
    assert second.at == first.at + 60
    assert vault.samples.history() == [first, second]
