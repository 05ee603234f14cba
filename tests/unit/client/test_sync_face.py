"""The blocking face is derived from the async one and cannot drift from it."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import pytest

from checkpoint_vault.client import AsyncVaultClient, SaveFields, SaveOptions, VaultClient
from checkpoint_vault.client._gen_sync import TARGET, generate

# Different by design: the blocking file object against the async one.
RETURNS_DIFFER = {"open"}


def _public_methods(cls: type) -> dict[str, Callable[..., Any]]:
    return {
        name: getattr(cls, name)
        for name in dir(cls)
        if not name.startswith("_") and inspect.isfunction(getattr(cls, name))
    }


def test_the_generated_sync_client_is_up_to_date() -> None:
    assert TARGET.read_text() == generate(), "run: python -m client._gen_sync"


def test_both_faces_have_the_same_methods() -> None:
    assert set(_public_methods(VaultClient)) == set(_public_methods(AsyncVaultClient))


@pytest.mark.parametrize("name", ["__init__", *sorted(_public_methods(AsyncVaultClient))])
def test_each_method_takes_the_same_parameters(name: str) -> None:
    sync = inspect.signature(getattr(VaultClient, name))
    aio = inspect.signature(getattr(AsyncVaultClient, name))
    assert sync.parameters == aio.parameters
    if name not in RETURNS_DIFFER:
        assert sync.return_annotation == aio.return_annotation


def test_save_fields_are_the_save_options() -> None:
    assert list(SaveFields.__annotations__) == [f.name for f in fields(SaveOptions)]


def test_save_options_are_built_in_one_place() -> None:
    opts = SaveOptions.of(
        {"parent": "latest", "metadata": None, "tags": ["a"], "chunking": "small"}
    )
    assert opts == SaveOptions(parent="latest", tags=("a",), chunking="small")
    assert opts.wire() == {
        "parent": "latest",
        "inherit": False,
        "metadata": {},
        "tags": ["a"],
        "chunking": "small",
    }
    assert "chunking" not in SaveOptions().wire()  # the namespace's profile decides
    with pytest.raises(TypeError, match="unknown save option"):
        SaveOptions.of({"parnet": "x"})  # type: ignore[typeddict-unknown-key]
