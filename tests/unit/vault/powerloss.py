"""What the durability tests share: a child process that saves agent states and dies
unclosed (`os._exit`: the page cache keeps every write, as after SIGKILL), and disks
after a power loss built from two copies of the LMDB files."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DATA_FILES = ("catalog/data.mdb", "frames/data.mdb")
PAGE = 4096

_PREAMBLE = """
import json, os, shutil, threading
from pathlib import Path
import vault.syncer
from checkpoint_vault.vault import Vault

def state(i):
    return json.dumps([{"role": "user", "content": "turn " * 40 + str(k)}
                       for k in range(i + 20)]).encode()

def snapshot(vault_dir, to):
    for name in DATA_FILES:
        Path(to, name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(vault_dir, name), Path(to, name))
"""


def run_child(vault_dir: Path, body: str) -> list[str]:
    """Run `body` in a child with `v` the vault at `vault_dir`, `state(i)` an agent
    state and `snapshot(vault_dir, to)` a copy of the LMDB files in scope; it prints a
    JSON list of ids as its last line, which is returned."""
    code = (
        _PREAMBLE
        + f"DATA_FILES = {DATA_FILES!r}\nv = Vault({str(vault_dir)!r})\n"
        + textwrap.dedent(body)
        + "\nos._exit(0)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    ids: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return ids


def mix(old: bytes, new: bytes, rng: random.Random) -> bytes:
    """A disk after power loss: each page written since `old` may or may not be there."""
    out = bytearray(new)
    for at in range(0, len(new), PAGE):
        if rng.random() < 0.5:
            out[at : at + PAGE] = old[at : at + PAGE].ljust(min(PAGE, len(new) - at), b"\0")
    return bytes(out)


def overwrite(path: Path, data: bytes) -> None:
    """New contents in the same file (its inode stays, as on a disk after power loss)."""
    with path.open("r+b") as f:
        f.write(data)
        f.truncate()
