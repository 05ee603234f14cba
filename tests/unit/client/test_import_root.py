"""`checkpoint_vault` is the import root the contract names (`from checkpoint_vault import
VaultClient`): it offers every public name of the client, the same objects, and stays as
light to import as the client."""

from __future__ import annotations

import subprocess
import sys

import checkpoint_vault
from checkpoint_vault import client


def test_the_root_offers_every_client_name_as_the_same_object() -> None:
    assert sorted(checkpoint_vault.__all__) == sorted(client.__all__)
    for name in client.__all__:  # ERROR_CODES used to fail: looked up as client.protocol
        assert getattr(checkpoint_vault, name) is getattr(client, name), name


def test_importing_the_root_loads_no_server_and_no_client_machinery() -> None:
    code = (
        "import sys, checkpoint_vault; "
        "print(sorted({'aiohttp', 'lmdb', 'client.sync', 'client.aio'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
