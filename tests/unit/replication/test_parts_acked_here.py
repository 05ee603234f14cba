"""A part's writes are acknowledged once durable on the node, not when the sync replica has
them (vault/writer.py `local`, vault/parts.py "Acknowledged here"), and the replica still
gets them, in commit order, once its store answers again.

The store is a local-dir tier behind `FaultyTier` failing every call: the replica's uploads
stall. Before the change the part's first chunk never returned (the bounded wait below).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from checkpoint_vault.tiering.backends.local import LocalTier
from checkpoint_vault.tiering.wrappers import FaultyTier
from checkpoint_vault.vault import Vault
from checkpoint_vault.vault.parts import PartManifest
from checkpoint_vault.vault.replication import restore_replica

from ..vault.helpers import client_save
from ..vault.test_parts import save_part
from .test_replica import _open, _wait_caught_up, replication_of

pytestmark = pytest.mark.slow  # ~1.5 s: the replica's retries and catch-up

BOUND = 20.0  # seconds for a part of 3 kB with the replica stalled (milliseconds here)


def _bounded(vault: Vault) -> PartManifest:
    """The part saved (and claimed, as an owner's commit not waiting for shipping does) on
    a thread, bounded: before the change neither returned while the replica stalled."""
    out: list[PartManifest | BaseException] = []

    def run() -> None:
        try:
            part = save_part(vault, "job", {"rank0.bin": os.urandom(3000)})
            out.append(vault.parts.claim(part.id))
        except BaseException as e:  # noqa: BLE001 - handed to the test below
            out.append(e)

    thread = threading.Thread(target=run, daemon=True)  # left behind if it never returns
    thread.start()
    thread.join(BOUND)
    assert out, f"the part was not acknowledged in {BOUND} s with the replica stalled"
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def test_a_part_is_acknowledged_with_the_replica_stalled_and_replicated_after(
    tmp_path: Path,
) -> None:
    tier = FaultyTier(LocalTier(str(tmp_path / "tier"), "cold"))
    vault = _open(tmp_path / "primary", tier, mode="sync")
    try:
        client_save(vault, "ns", {"a": os.urandom(3000)})  # a sync save: in the replica
        _wait_caught_up(vault)
        tier.fail_next = 10**9  # the store is down: the replica's uploads stall
        part = _bounded(vault)
        assert part.claimed
        status = replication_of(vault)
        assert status.restorable_batch < status.batches  # acknowledged, not replicated
        assert status.lag_bytes > 0
        tier.fail_next = 0  # back: the replica ships what it owes, in order
        _wait_caught_up(vault)
    finally:
        vault.close()
    restore_replica(tier, tmp_path / "restored")
    restored = Vault(tmp_path / "restored")
    try:
        held = restored.parts.manifest(part.id)
        assert held.claimed
        assert held.files == part.files
        assert {p.id for p in restored.parts.held()} == {part.id}
    finally:
        restored.close()
