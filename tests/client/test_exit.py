"""A client the program never closed is closed quietly: at exit, or when collected.

ResourceWarnings are shown (Python hides them by default): a connection the client left
open would print "unclosed <socket ...>".
"""

from __future__ import annotations

import os
import subprocess
import sys

from checkpoint_vault.client import VaultClient

from ..serverproc import ServerProcess

NEVER_CLOSED = """
import sys
from checkpoint_vault.client import VaultClient

vault = VaultClient(progress=False)
ckpt = vault.save("x/exit", {"a": b"saved"})
with vault.open("x/exit", ckpt.id, "a") as f:
    assert f.read() == b"saved"
VaultClient(progress=False).get("x/exit", ckpt.id)  # a client dropped at once
handle = vault.save("x/exit", {"b": b"in flight at exit"}, background=True, tags=["last"])
print(ckpt.id)
"""


def test_a_script_that_never_closes_its_client_exits_quietly(
    server: ServerProcess, vault: VaultClient
) -> None:
    env = {**os.environ, "CKPT_URL": server.url, "CKPT_TOKEN": server.token}
    done = subprocess.run(
        [sys.executable, "-W", "always::ResourceWarning", "-c", NEVER_CLOSED],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert vault.get("x/exit", done.stdout.strip()).files["a"].size == 5
    assert vault.list("x/exit", tag="last")  # the background save finished before exit
