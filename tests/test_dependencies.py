"""Every third-party module the tests import is declared by the project's own extras.

A module the suite imports that no extra names passes on a machine whose Python happens to
have it and fails a user's fresh venv at collection (`jsonschema` did: the README's test
command stopped there while CI passed). Declared means named directly in the base
dependencies or an extra the `test` extra pulls in, not merely arriving as another
package's dependency, which can change under us with that package's next release.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
OURS = {
    "checkpoint_vault", "protocol", "vault", "tiering", "maintenance", "cluster", "api",
    "client", "cli", "tests", "bench",
}  # fmt: skip
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SELF = re.compile(r"checkpoint-vault\[([^\]]+)\]")


def _normal(name: str) -> str:
    """PEP 503 normalised, so `PyYAML` and `pyyaml` compare equal."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_for_tests() -> set[str]:
    """Distributions named by the base dependencies, `test` and the extras it includes."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]
    names: set[str] = set()
    todo, seen = [*project["dependencies"], *extras["test"]], {"test"}
    while todo:
        requirement = todo.pop()
        if included := _SELF.match(requirement):
            for extra in included.group(1).split(","):
                if extra.strip() not in seen:
                    seen.add(extra.strip())
                    todo += extras[extra.strip()]
            continue
        match = _NAME.match(requirement)
        assert match, requirement
        names.add(_normal(match.group()))
    return names


def imported_by_tests() -> dict[str, set[str]]:
    """Top-level third-party modules the tests import, each with the files importing it."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top not in sys.stdlib_module_names and top not in OURS | {"__future__"}:
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def undeclared(declared: set[str]) -> dict[str, tuple[list[str], list[str]]]:
    """Modules the tests import that no name in `declared` provides: (its distributions,
    the first files importing it)."""
    providers = importlib.metadata.packages_distributions()
    missing = {}
    for module, files in imported_by_tests().items():
        # A module not installed here (tomli, before 3.11) is declared under its own name.
        dists = {_normal(d) for d in providers.get(module, [module])}
        if not dists & declared:
            missing[module] = (sorted(dists) or ["(not installed)"], sorted(files)[:3])
    return missing


def test_every_module_the_tests_import_is_declared() -> None:
    missing = undeclared(declared_for_tests())
    assert not missing, f"imported by tests, declared by no extra: {missing}"


def test_an_undeclared_module_is_found() -> None:
    """The check can fail: without its line in the `test` extra, `jsonschema` (the module
    that stopped a user's fresh install at collection) is named."""
    assert "jsonschema" in undeclared(declared_for_tests() - {"jsonschema"})
