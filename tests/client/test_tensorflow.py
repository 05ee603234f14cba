"""`client.tensorflow` with a real tensorflow-cpu model: saved into the vault, restored
into a fresh model and optimizer with identical weights, Adam slots and step."""

from __future__ import annotations

import os
from types import ModuleType

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TF's start-up notices, not errors

import numpy as np
import pytest

from checkpoint_vault.client import VaultClient
from checkpoint_vault.client.tensorflow import VaultCheckpointManager

from .conftest import loaded_by

# TensorFlow 2.21 and its protobuf deprecate things it still uses itself.
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(scope="module")
def tf() -> ModuleType:
    """TensorFlow, imported by the test that uses it: imported at collection, it cost every
    xdist worker ~15 s before its first test, the worker that never runs this file too."""
    return pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def keras(tf: ModuleType) -> ModuleType:
    return pytest.importorskip("keras")


def _model(keras: ModuleType) -> tuple[object, object]:
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(2)])
    optimizer = keras.optimizers.Adam(1e-2)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def _train(tf: ModuleType, model: object, optimizer: object, steps: int) -> None:
    rng = np.random.default_rng(0)
    for _ in range(steps):
        x = tf.constant(rng.normal(size=(32, 8)), dtype=tf.float32)
        y = tf.constant(rng.normal(size=(32, 2)), dtype=tf.float32)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)  # type: ignore[operator]
        grads = tape.gradient(loss, model.trainable_variables)  # type: ignore[attr-defined]
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))  # type: ignore[attr-defined]


def _state(model: object, optimizer: object) -> list[np.ndarray]:
    return [np.array(v) for v in [*model.weights, *optimizer.variables]]  # type: ignore[attr-defined]


def test_save_and_restore_weights_and_optimizer_step(
    vault: VaultClient, tf: ModuleType, keras: ModuleType
) -> None:
    model, optimizer = _model(keras)
    manager = VaultCheckpointManager(
        tf.train.Checkpoint(model=model, optimizer=optimizer), vault, "tf/run1", max_to_keep=2
    )
    assert manager.restore_or_initialize() is None
    ids = []
    for _ in range(3):
        _train(tf, model, optimizer, 5)
        ids.append(manager.save())
    assert int(optimizer.iterations.numpy()) == 15  # type: ignore[attr-defined]
    expected = _state(model, optimizer)
    assert manager.checkpoints == ids[1:]  # max_to_keep=2: the first one deleted
    newest = vault.get("tf/run1")
    assert newest.metadata["step"] == 3
    assert newest.parent == ids[1]
    assert sorted(newest.files) == ["ckpt-3.data-00000-of-00001", "ckpt-3.index"]

    fresh_model, fresh_optimizer = _model(keras)
    assert int(fresh_optimizer.iterations.numpy()) == 0  # type: ignore[attr-defined]
    restorer = VaultCheckpointManager(
        tf.train.Checkpoint(model=fresh_model, optimizer=fresh_optimizer), vault, "tf/run1"
    )
    assert restorer.restore_or_initialize() == ids[-1]
    assert int(fresh_optimizer.iterations.numpy()) == 15  # type: ignore[attr-defined]
    got = _state(fresh_model, fresh_optimizer)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    _train(tf, fresh_model, fresh_optimizer, 1)  # training goes on from there
    _train(tf, model, optimizer, 1)
    for a, b in zip(_state(fresh_model, fresh_optimizer), _state(model, optimizer), strict=True):
        np.testing.assert_array_equal(a, b)
    restorer.close()


def test_importing_the_module_does_not_import_tensorflow() -> None:
    assert loaded_by("client.tensorflow", {"tensorflow", "keras", "aiohttp", "lmdb"}) == "[]"
