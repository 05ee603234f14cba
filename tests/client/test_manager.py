"""client.CheckpointManager against a real server: cadence, lineage, keep rules pushed to
retention, validity, restore, and the save on SIGTERM."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from checkpoint_vault.client import CheckpointManager, NotFound, VaultClient
from checkpoint_vault.client.manager import KeepBest, finite_metrics

from ..serverproc import ServerProcess


class FakeClock:
    """Seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def steps_of(vault: VaultClient, namespace: str) -> list[int]:
    """The steps of the namespace's live checkpoints, oldest first."""
    return sorted(c.metadata["step"] for c in vault.list(namespace))


def test_cadence_by_steps_and_by_seconds(vault: VaultClient) -> None:
    clock = FakeClock()
    manager = CheckpointManager(vault, "m/cadence", every_steps=3, every_seconds=60, clock=clock)
    assert [s for s in range(1, 10) if manager.should_save(s)] == [3, 6, 9]
    clock.now += 60
    assert manager.should_save(4)  # a minute since the manager began
    manager.save(4, {"w": b"four"})
    assert not manager.should_save(4)  # the step just saved
    assert not manager.should_save(5)  # and the clock restarted with it
    clock.now += 59.5
    assert not manager.should_save(5)
    clock.now += 0.5
    assert manager.should_save(5)
    manager.close()
    assert steps_of(vault, "m/cadence") == [4]


def test_saves_chain_in_step_order_with_step_and_metrics(server: ServerProcess) -> None:
    """Three saves in flight at once still commit in step order, each the previous one's
    child."""
    with VaultClient(server.url, server.token, progress=False, max_background_saves=3) as c:
        with CheckpointManager(c, "m/chain", metadata={"run": "a"}) as manager:
            handles = [
                manager.save(step, {"w": bytes([step]) * 1000}, metrics={"loss": 1 / step})
                for step in (1, 2, 3)
            ]
        chain = c.lineage("m/chain")
    assert [ck.metadata["step"] for ck in chain] == [3, 2, 1]
    assert [ck.id for ck in chain] == [h.result().id for h in reversed(handles)]
    assert chain[0].metadata == {"run": "a", "step": 3, "loss": pytest.approx(1 / 3)}
    assert chain[-1].parent is None


def test_a_torch_state_saves_and_restores(vault: VaultClient, tmp_path: Path) -> None:
    weights = torch.arange(10.0)
    state = {"w": weights, "step": 7}
    with CheckpointManager(vault, "m/state") as manager:
        manager.save(7, state=state)
        weights.add_(1)  # after save returns: the copy taken is what is stored
        assert manager.latest_step() == 7
        ck = manager.restore(dest=str(tmp_path))
    assert ck is not None
    assert ck.metadata["step"] == 7
    loaded = torch.load(tmp_path / "state.pt", weights_only=True)
    assert torch.equal(loaded["w"], torch.arange(10.0))


def test_keep_rules_become_the_namespace_retention(vault: VaultClient) -> None:
    ns = "m/keep"
    manager = CheckpointManager(
        vault, ns, keep_last=2, keep_best=KeepBest("loss", "min", 1), keep_every_steps=4
    )
    with pytest.raises(NotFound):  # no namespace before its first checkpoint
        vault.policy(ns)
    losses = {1: 5.0, 2: 0.5, 3: 4.0, 4: 3.0, 5: 2.5, 6: 2.0, 7: 1.5, 8: 1.0, 9: 0.9}
    for step, loss in losses.items():
        manager.save(step, {"w": bytes([step])}, metrics={"loss": loss})
    manager.wait()
    rules = vault.policy(ns).retention
    assert rules.keep_last == 2
    assert rules.keep_best is not None
    assert (rules.keep_best.metric, rules.keep_best.mode, rules.keep_best.n) == ("loss", "min", 1)
    assert rules.keep_tags == ["every-4"]
    deleted = manager.prune()
    # last two (8, 9), best loss (2), every fourth (4, 8)
    assert steps_of(vault, ns) == [2, 4, 8, 9]
    assert len(deleted) == 5
    manager.close()
    # a second run's manager sets its rules at once, keeping the tags already kept
    CheckpointManager(vault, ns, keep_last=1, keep_every_steps=3).close()
    rules = vault.policy(ns).retention
    assert (rules.keep_last, rules.keep_tags) == (1, ["every-3", "every-4"])


def test_restore_skips_a_checkpoint_marked_invalid(vault: VaultClient, tmp_path: Path) -> None:
    ns = "m/valid"
    with CheckpointManager(vault, ns) as empty:
        assert empty.latest_step() is None
        assert empty.restore(dest=str(tmp_path / "none")) is None
    manager = CheckpointManager(vault, ns, validate=finite_metrics("loss"))
    good = manager.save(1, {"w": b"good"}, metrics={"loss": 1.0}).result()
    bad = manager.save(2, {"w": b"bad"}, metrics={"loss": float("nan")}).result()
    assert good.valid is True
    assert bad.valid is False
    assert bad.validity.reason == "loss is nan"
    assert bad.metadata["loss"] == "nan"
    assert manager.latest_step() == 1
    restored = manager.restore(dest=str(tmp_path / "latest"))
    assert restored is not None
    assert restored.id == good.id
    assert (tmp_path / "latest" / "w").read_bytes() == b"good"
    with pytest.raises(NotFound):
        manager.restore(step=2, dest=str(tmp_path / "two"))
    assert manager.restore(step=1, dest=str(tmp_path / "one")) is not None
    # the run goes on from the restored checkpoint: its next save is that one's child
    again = manager.save(2, {"w": b"again"}, metrics={"loss": 0.9}).result()
    assert again.parent == good.id
    assert again.valid is True
    manager.close()


def test_sigterm_saves_at_the_next_step_and_stops_the_loop(vault: VaultClient) -> None:
    before = signal.getsignal(signal.SIGTERM)
    manager = CheckpointManager(vault, "m/preempt", every_steps=100, save_on_sigterm=True)
    last = 0
    for step in range(1, 50):
        last = step
        if step == 3:
            signal.raise_signal(signal.SIGTERM)  # the scheduler's preemption notice
        if manager.should_save(step):
            manager.save(step, {"w": bytes([step])})
        if manager.preempted:
            break
    manager.close()
    assert last == 3
    ck = vault.get("m/preempt")
    assert ck.metadata == {"step": 3, "preempted": True}
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_save_after_its_parent_was_deleted_follows_the_newest_left(vault: VaultClient) -> None:
    """Lightning's top-k may delete the checkpoint just saved; the next one still commits."""
    with CheckpointManager(vault, "m/gone") as manager:
        one = manager.save(1, {"w": b"1"}).result()
        two = manager.save(2, {"w": b"2"}).result()
        vault.delete("m/gone", two.id)
        three = manager.save(3, {"w": b"3"}).result()
    assert three.parent == one.id
