"""Tiering's operations run under the hold of the task that calls them: the tiering run, and
GC followed by repack, each run through `maintenance.run`, wait for a holder in another
process, and every repack and move inside is under that one hold."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from checkpoint_vault import maintenance
from checkpoint_vault.tiering import MemoryTier
from checkpoint_vault.tiering.repack import move_packed, repack
from checkpoint_vault.vault import FakeClock, Vault, VaultConfig

from ...lockholder import assert_waits_for_holder
from ..vault.helpers import stream_save


@pytest.fixture
def vault(tmp_path: Path) -> Iterator[Vault]:
    v = Vault(
        tmp_path / "v", VaultConfig(gc_grace=0.0), FakeClock(), tiers={"cold": MemoryTier("cold")}
    )
    rng = random.Random(3)
    for _ in range(2):
        stream_save(v, "ns", {"w": rng.randbytes(100_000)})
    v.set_policy("ns", {"tiering": {"target": "cold", "keep_hot_last": 0}})
    yield v
    v.close()


OPERATIONS: dict[str, Callable[[Vault], Any]] = {
    "tiering": lambda v: maintenance.tiering(v, dry_run=False),
    "repack": lambda v: repack(v, 1.0),
    "move_packed": lambda v: move_packed(v, "cold", []),
    "gc": maintenance.gc,
}


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_tiering_operations_wait_for_a_holder_in_another_process(vault: Vault, name: str) -> None:
    assert_waits_for_holder(
        vault, lambda: maintenance.run(vault, name, lambda: OPERATIONS[name](vault))
    )


def test_the_gc_task_without_tiers_is_plain_gc(tmp_path: Path) -> None:
    vault = Vault(tmp_path / "v", VaultConfig(gc_grace=0.0), FakeClock())
    try:
        rec = stream_save(vault, "ns", {"w": b"z" * 50_000})
        vault.lifecycle.delete("ns", rec.id)
        vault.store.clock.advance(7 * 3600)  # type: ignore[attr-defined]  # past the upload TTL
        result = maintenance.gc(vault)
        assert result.chunks_deleted > 0
        assert result.packs_rewritten is None
        assert "packs_rewritten" not in result.to_wire()
        assert not vault.maintenance.held
    finally:
        vault.close()
