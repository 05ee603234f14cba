"""The two installs from one pyproject, in a fresh venv: `pip install .` is the client alone.

A producer's machine gets the client, the CLI's client commands and the integrations' base,
none of the server's storage stack; `ckpt serve` there names the extra to install. The full
install (`.[server]`) is what the rest of the suite runs on.
"""

from __future__ import annotations

import shutil
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVER_ONLY = {"lmdb", "obstore", "cryptography", "numcodecs", "numpy", "aiohttp", "zstandard"}


@pytest.mark.slow
def test_pip_install_dot_is_the_client_only(tmp_path: Path) -> None:
    src = tmp_path / "src"  # a copy, so the build leaves nothing in the work tree
    shutil.copytree(
        ROOT, src, ignore=shutil.ignore_patterns(".git", "*.egg-info", "build", "__pycache__")
    )
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    pip = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert pip.returncode == 0, pip.stderr[-2000:]
    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True
    ).stdout
    installed = {line.split("==")[0].lower().replace("-", "_") for line in listed.split()}
    assert "checkpoint_vault" in installed
    assert not installed & SERVER_ONLY, sorted(installed & SERVER_ONLY)

    client = subprocess.run(
        [
            python,
            "-c",
            "from checkpoint_vault import VaultClient, AsyncVaultClient, cli",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert client.returncode == 0, client.stderr
    # One top-level package: a user's own `client.py` or `api/` shadows nothing of ours.
    shown = subprocess.run(
        [python, "-m", "pip", "show", "-f", "checkpoint-vault"], capture_output=True, text=True
    ).stdout
    files = shown.split("Files:", 1)[1].split()
    tops = {f.split("/")[0] for f in files if not f.startswith("..")}  # ../bin/ckpt
    assert {t for t in tops if not t.endswith(".dist-info")} == {"checkpoint_vault"}, tops
    console = [f for f in files if f.startswith("checkpoint_vault/api/static/ui/")]
    assert console, "the web console's files are installed"
    ckpt = str(env_dir / "bin" / "ckpt")
    assert subprocess.run([ckpt, "--help"], capture_output=True, cwd=tmp_path).returncode == 0
    serve = subprocess.run(
        [ckpt, "serve", "--data", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert serve.returncode == 1
    assert "pip install 'checkpoint-vault[server]'" in serve.stderr, serve.stderr
    assert not (tmp_path / "data").exists()
