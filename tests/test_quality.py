"""Lint, format and type checks run as part of the suite, so CI's one command covers them."""

from __future__ import annotations

import ast
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = [
    "checkpoint_vault",
    "protocol",
    "vault",
    "tiering",
    "maintenance",
    "cluster",
    "api",
    "node",
    "client",
    "cli",
]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m <args>` in the checkout, or `python -c <code>` when args start with -c:
    outside it, so the folders of the checkout cannot stand in for the installed root."""
    if args[0] == "-c":
        argv, cwd = [sys.executable, *args], Path(tempfile.gettempdir())
    else:
        argv, cwd = [sys.executable, "-m", *args], ROOT
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)


# Names a -c snippet uses to tell our packages apart in sys.modules.
OURS = "ours = lambda m: m.split('.')[1] if m.startswith('checkpoint_vault.') else None; "


def test_ruff_lint() -> None:
    result = run("ruff", "check", "--output-format", "concise", *PACKAGES, "tests", "bench")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format() -> None:
    result = run("ruff", "format", "--check", *PACKAGES, "tests", "bench")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict() -> None:
    result = run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "module",
    [
        "checkpoint_vault.vault",
        "checkpoint_vault.tiering",
        "checkpoint_vault.maintenance",
        "checkpoint_vault.api",
        "checkpoint_vault.client",
        "checkpoint_vault.protocol",
        "checkpoint_vault.cli",
        "checkpoint_vault.cluster",
        "checkpoint_vault.node",
        "checkpoint_vault.node.serve",
        "checkpoint_vault.node.worker",
        "checkpoint_vault.api.routes",
        "checkpoint_vault.client.torch",
        "checkpoint_vault.client.dcp",
        "checkpoint_vault.client.langgraph",
        "checkpoint_vault.client.fsspec",
        "checkpoint_vault.client.manager",
        "checkpoint_vault.client.hf",
        "checkpoint_vault.client.lightning",
        "checkpoint_vault.client.importers",
    ],
)
def test_each_module_imports_alone(module: str) -> None:
    result = run("-c", f"import {module}")
    assert result.returncode == 0, result.stderr


API_MODULES = sorted(
    ".".join(("checkpoint_vault", *p.relative_to(ROOT).with_suffix("").parts)).removesuffix(
        ".__init__"
    )
    for p in (ROOT / "api").rglob("*.py")
)
# The entry point (node/ starts the processes); others use api.keys
APP_IMPORTERS = {"checkpoint_vault.api"}


@pytest.mark.parametrize("module", API_MODULES)
def test_each_api_module_imports_alone(module: str) -> None:
    result = run("-c", f"import {module}")
    assert result.returncode == 0, result.stderr


def _imported_modules(module: str, path: Path) -> set[str]:
    """Absolute names of what a module imports (relative imports resolved)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[: len(base) - node.level + 1] if node.level else []
            stem = ".".join([*base, *([node.module] if node.module else [])])
            out.add(stem)
            out.update(f"{stem}.{alias.name}" for alias in node.names)
    return out


def test_only_entry_points_import_the_app_factory() -> None:
    """AppKeys live in api/keys.py: a module importing api.app would put the factory (which
    imports every route) back into an import circle."""
    offenders = []
    for module in API_MODULES:
        path = ROOT / Path(*module.split(".")[1:])
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if module not in APP_IMPORTERS and "checkpoint_vault.api.app" in _imported_modules(
            module, path
        ):
            offenders.append(module)
    assert offenders == []


def test_the_client_imports_no_aiohttp_even_connected() -> None:
    """`import client` and `ckpt pull` stay fast: the client's HTTP is the standard
    library's (client/connections.py), and aiohttp is the server's alone."""
    code = (
        "import sys, checkpoint_vault.cli, checkpoint_vault.client.remotefile; "
        "import checkpoint_vault.client.fsspec; "
        "from checkpoint_vault import VaultClient; "
        "VaultClient('http://127.0.0.1:9', progress=False).close(); "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'aiohttp'); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = run("-c", code)
    assert result.returncode == 0, result.stdout


def test_client_does_not_import_server_dependencies() -> None:
    code = (
        "import sys, checkpoint_vault.client, checkpoint_vault.cli; " + OURS + ""
        "bad = {'lmdb', 'zstandard', 'aiohttp.web'} & set(sys.modules); "
        "bad |= {m for m in sys.modules if ours(m) in ('vault', 'api', 'node')}; "
        "print(sorted(bad)); sys.exit(1 if bad else 0)"
    )
    result = run("-c", code)
    assert result.returncode == 0, result.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "module",
    ["client.torch", "client.dcp", "client.langgraph", "client.fsspec", "client.importers"],
)
def test_integrations_import_no_server_package(module: str) -> None:
    code = (
        f"import sys, checkpoint_vault.{module}; " + OURS + ""
        "bad = {m for m in sys.modules if ours(m) in ('api', 'node', 'vault', 'tiering')}; "
        "bad |= {m for m in sys.modules if m.split('.')[0] == 'lmdb'}; "
        "print(sorted(bad)); sys.exit(1 if bad else 0)"
    )
    result = run("-c", code)
    assert result.returncode == 0, result.stdout


def test_vault_imports_none_of_our_other_packages_but_the_protocol() -> None:
    code = (
        "import sys, checkpoint_vault.vault; " + OURS + ""
        "bad = {m for m in sys.modules if ours(m) in ('api', 'node', 'client', 'tiering')}; "
        "bad.discard('checkpoint_vault.client'); "  # the root names its (lazy) client
        "print(sorted(bad)); sys.exit(1 if bad else 0)"
    )
    result = run("-c", code)
    assert result.returncode == 0, result.stdout
