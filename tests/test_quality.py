"""Lint, format and type checks run as part of the suite, so CI's one command covers them."""

from __future__ import annotations

import ast
import subprocess
import sys
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
    "client",
    "cli",
]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m <args>`, or `python -c <code>` when args start with -c."""
    argv = [sys.executable, *args] if args[0] == "-c" else [sys.executable, "-m", *args]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_lint() -> None:
    result = run("ruff", "check", "--output-format", "concise", *PACKAGES, "tests", "bench")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format() -> None:
    result = run("ruff", "format", "--check", *PACKAGES, "tests", "bench")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict() -> None:
    result = run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "module",
    [
        "vault",
        "tiering",
        "maintenance",
        "api",
        "client",
        "protocol",
        "cli",
        "node.serve",
        "api.routes",
        "client.torch",
        "client.dcp",
        "client.langgraph",
        "client.fsspec",
        "client.manager",
        "client.hf",
        "client.lightning",
        "client.importers",
    ],
)
def test_each_module_imports_alone(module: str) -> None:
    result = run("-c", f"import {module}")
    assert result.returncode == 0, result.stderr


API_MODULES = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for p in (ROOT / "api").rglob("*.py")
)
APP_IMPORTERS = {"api", "node.serve", "node.worker"}  # the entry points; others use api.keys


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
        path = ROOT / Path(*module.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if module not in APP_IMPORTERS and "api.app" in _imported_modules(module, path):
            offenders.append(module)
    assert offenders == []


def test_the_client_imports_no_aiohttp_even_connected() -> None:
    """`import client` and `ckpt pull` stay fast: the client's HTTP is the standard
    library's (client/connections.py), and aiohttp is the server's alone."""
    code = (
        "import sys, cli, client.remotefile, client.fsspec; "
        "from client import VaultClient; "
        "VaultClient('http://127.0.0.1:9', progress=False).close(); "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'aiohttp'); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = run("-c", code)
    assert result.returncode == 0, result.stdout


def test_client_does_not_import_server_dependencies() -> None:
    code = (
        "import sys, client, cli; "
        "bad = {'lmdb', 'zstandard', 'vault', 'api', 'aiohttp.web'} & set(sys.modules); "
        "print(sorted(bad)); sys.exit(1 if bad else 0)"
    )
    result = run("-c", code)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize(
    "module",
    ["client.torch", "client.dcp", "client.langgraph", "client.fsspec", "client.importers"],
)
def test_integrations_import_no_server_package(module: str) -> None:
    code = (
        f"import sys, {module}; "
        "bad = {m for m in sys.modules if m.split('.')[0] in ('api', 'vault', 'tiering', 'lmdb')}; "
        "print(sorted(bad)); sys.exit(1 if bad else 0)"
    )
    result = run("-c", code)
    assert result.returncode == 0, result.stdout


def test_vault_imports_none_of_our_other_packages_but_the_protocol() -> None:
    code = (
        "import sys, vault; "
        "bad = {m for m in sys.modules if m.split('.')[0] in ('api', 'client', 'tiering')"
        " and m != 'client' and not m.startswith('protocol')}; "
        "print(sorted(bad)); sys.exit(1 if bad else 0)"
    )
    result = run("-c", code)
    assert result.returncode == 0, result.stdout
