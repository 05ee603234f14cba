"""Package floors and the one error table.

The packages stand on floors (docs/DESIGN.md): the wire protocol at the bottom imports only
the standard library (and pyfastcdc in its chunker); the engine, tiering and the service
stand on it, the client beside them on the protocol alone, the CLI on top. Every error code
the server can emit is in the protocol's table with a specific client class. The scans read
source (ast), so an import inside a function counts too; the error walk imports every module
of vault, tiering and api, so a subclass declared anywhere counts.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROOT_PACKAGE = "checkpoint_vault"  # the one import root: its subpackages are the folders


def imported_modules(path: Path) -> set[str]:
    """Absolute module names a file imports (relative imports resolved from its package)."""
    tree = ast.parse(path.read_text(), str(path))
    parts = path.relative_to(ROOT).with_suffix("").parts[:-1]
    package = ".".join(parts if parts[0] == ROOT_PACKAGE else (ROOT_PACKAGE, *parts))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)
    return out


def sources(package: str) -> list[Path]:
    """The package's files; the root's own, not its links to the folders."""
    if package == ROOT_PACKAGE:
        return sorted((ROOT / package).glob("*.py"))
    return sorted((ROOT / package).rglob("*.py"))


def floor_of(module: str) -> str | None:
    """Which package of ours a module is in (`checkpoint_vault.api.keys` -> `api`), or None
    (the bare root: `from checkpoint_vault import api` names `checkpoint_vault.api` too)."""
    parts = module.split(".")
    if parts[0] != ROOT_PACKAGE or len(parts) == 1:
        return None
    return parts[1] if parts[1] in FLOORS else ROOT_PACKAGE


# Floors, bottom up: what each package may import of ours. The CLI is the top floor; the
# client stands beside the server on the protocol, never under or over it.
FLOORS: dict[str, set[str]] = {
    "protocol": set(),
    "vault": {"protocol"},
    "tiering": {"protocol", "vault"},
    # A cluster's engine side (leases, members, shard map, tokens): no HTTP, no tiers
    # opened here (api/cluster/context.py hands it one).
    "cluster": {"protocol", "vault"},
    "maintenance": {"protocol", "vault", "tiering"},
    "api": {"protocol", "vault", "tiering", "maintenance", "cluster"},
    # The process floor (issue 42): the roles of a node's processes, on the HTTP core.
    "node": {"protocol", "vault", "tiering", "maintenance", "cluster", "api"},
    "client": {"protocol"},
    "cli": {"protocol", "vault", "tiering", "maintenance", "cluster", "api", "node", "client"},
    # The import root (issue 42): today the client's names only, so a producer's install
    # (no server extra) can import it.
    "checkpoint_vault": {"client"},
}


def package_graph() -> dict[str, set[str]]:
    """Package -> the packages of ours its modules import (ast, so lazy imports count)."""
    graph: dict[str, set[str]] = {}
    for package in FLOORS:
        floors = {floor_of(m) for path in sources(package) for m in imported_modules(path)}
        graph[package] = {f for f in floors if f is not None and f != package}
    return graph


@pytest.mark.slow
def test_every_import_of_ours_goes_through_the_root() -> None:
    """`import vault` works in a checkout (the folders are on the path) but not installed,
    where only `checkpoint_vault` is: each import of ours names the root."""
    bad = {
        f"{path.relative_to(ROOT)}: {module}"
        for package in FLOORS
        for path in sources(package)
        for module in imported_modules(path)
        if module.split(".")[0] in set(FLOORS) - {ROOT_PACKAGE}
    }
    for path in [*ROOT.glob("tests/**/*.py"), *ROOT.glob("bench/*.py")]:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            bad |= {
                f"{path.relative_to(ROOT)}: {n}"
                for n in names
                if n.split(".")[0] in FLOORS and n.split(".")[0] != ROOT_PACKAGE
            }
    assert not bad, sorted(bad)


def test_no_import_runs_against_the_floors() -> None:
    graph = package_graph()
    bad = {f"{p} -> {q}" for p, targets in graph.items() for q in targets - FLOORS[p]}
    assert not bad, sorted(bad)


def test_the_package_graph_has_no_cycle() -> None:
    graph = package_graph()
    done: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, " -> ".join((*path, node))
        if node not in done:
            for nxt in sorted(graph[node]):
                visit(nxt, (*path, node))
            done.add(node)

    for package in graph:
        visit(package, ())


def test_every_package_of_ours_is_on_a_floor() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages - {"tests", "bench"} == set(FLOORS)


def test_protocol_imports_only_the_standard_library() -> None:
    allowed_third_party = {"_chunking.py": {"pyfastcdc"}}
    bad = set()
    for path in sources("protocol"):
        for module in imported_modules(path):
            top = module.split(".")[0]
            if (
                floor_of(module) == "protocol"
                or top == "__future__"
                or top in sys.stdlib_module_names
            ):
                continue
            if top in allowed_third_party.get(path.name, set()):
                continue
            bad.add(f"{path.name}: {module}")
    assert not bad, sorted(bad)


def _import_all(package: str) -> None:
    root = importlib.import_module(f"{ROOT_PACKAGE}.{package}")
    for info in pkgutil.walk_packages(root.__path__, f"{root.__name__}."):
        importlib.import_module(info.name)


def _subclasses(cls: type) -> set[type]:
    return {c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))}


def server_error_classes() -> set[type]:
    """Every class whose `code` the server's one error middleware can put on the wire."""
    for package in ("vault", "tiering", "api"):
        _import_all(package)
    from checkpoint_vault.api.errors import ApiError
    from checkpoint_vault.vault.errors import VaultError

    return {VaultError, ApiError} | _subclasses(VaultError) | _subclasses(ApiError)


def server_codes() -> set[str]:
    """Every code api/ can emit: the error classes', aiohttp's HTTP errors as mapped, and the
    fallbacks for other 4xx/5xx and for bugs."""
    from checkpoint_vault.api import errors

    return (
        {c.code for c in server_error_classes()}  # type: ignore[attr-defined]
        | set(errors.HTTP_CODES.values())
        | {errors.FALLBACK_CLIENT, errors.INTERNAL}
    )


def test_every_server_error_class_is_in_the_table_with_its_status() -> None:
    from checkpoint_vault.protocol import ERROR_SPECS

    for cls in server_error_classes():
        spec = ERROR_SPECS.get(cls.code)  # type: ignore[attr-defined]
        assert spec is not None, f"{cls.__name__}: code {cls.code} is not in the table"  # type: ignore[attr-defined]
        assert cls.status == spec.status, cls.__name__  # type: ignore[attr-defined]
        assert cls.__name__ in spec.server, f"{cls.__name__} not listed for {spec.code}"


def test_every_code_the_server_can_emit_maps_to_its_own_client_class() -> None:
    from checkpoint_vault.client.errors import _BY_CODE, ClientError
    from checkpoint_vault.protocol import ERROR_SPECS

    codes = server_codes()
    assert {"key_unavailable", "unauthorized", "forbidden", "internal"} <= codes
    for code in codes:
        assert code in ERROR_SPECS, f"{code} is not in the protocol's table"
        cls = _BY_CODE.get(code)
        assert cls is not None, f"the client has no class for {code}"
        assert cls is not ClientError
        assert cls.code == code
        assert cls.__name__ == ERROR_SPECS[code].client


def test_every_aiohttp_status_mapping_agrees_with_the_table() -> None:
    from checkpoint_vault.api.errors import HTTP_CODES
    from checkpoint_vault.protocol import ERROR_CODES

    for status, code in HTTP_CODES.items():
        if status != 405:  # method not allowed is answered as a bad request, keeping 405
            assert ERROR_CODES[code] == status, code


def test_table_lists_no_code_the_server_cannot_emit() -> None:
    from checkpoint_vault.protocol import ERROR_CODES

    assert set(ERROR_CODES) == server_codes()


def test_docs_error_table_matches_the_protocol() -> None:
    """docs/API.md's "Errors" table has one row per code, with the table's status."""
    from checkpoint_vault.protocol import ERROR_CODES

    text = (ROOT / "docs" / "API.md").read_text()
    section = text[text.index("## Errors") :]
    section = section[: section.index("\n## ", 1)]
    rows = re.findall(r"^\| (\d{3}) \| `(\w+)` \|", section, re.MULTILINE)
    documented = {code: int(status) for status, code in rows}
    assert len(rows) == len(documented), "a code is documented twice"
    assert documented == ERROR_CODES


# -- the admin surface is typed --------------------------------------------------------
# Public functions of the engine, the service and the async client that still answer an
# untyped JSON object (issue 29), each with why it must. Everything else answers a record:
# protocol/_maintenance.py's and _admin.py's, serialised once by the routes.
UNTYPED_ALLOWED: dict[str, str] = {
    "vault.uploads.check_metadata": "producer metadata is an arbitrary JSON object",
    "api.parse.metadata": "producer metadata is an arbitrary JSON object",
    "api.http.json_body": "a request body before its handler reads the fields it knows",
    "api.routes.openapi.build_openapi": "the OpenAPI document: JSON Schema is arbitrary JSON",
    "api.settings.effective_config": "the configuration as loaded, table by TOML table",
}
# At most this many, whatever the list says: the bound.
UNTYPED_BOUND = 5
# Annotations that spell an untyped JSON object: dict[str, Any] and its aliases.
_UNTYPED = re.compile(r"\b(dict\[str, ?(Any|JSON)\]|JSONObject)")


def _public_functions(
    source: str, filename: str
) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(qualified name, node) of each public function and method of public classes."""
    out: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef)
            ) and not node.name.startswith("_"):
                out.append((prefix + node.name, node))

    walk(ast.parse(source, filename).body, "")
    return out


def untyped_returns() -> list[str]:
    """`module.qualname` of every public function in vault/, tiering/, api/ and the async
    client whose return annotation is an untyped JSON object (or a list of them)."""
    paths = [*sources("vault"), *sources("tiering"), *sources("api"), ROOT / "client" / "aio.py"]
    found: list[str] = []
    for path in paths:
        rel = path.relative_to(ROOT).with_suffix("")
        if any(part.startswith("_") and part != "__init__" for part in rel.parts):
            continue
        module = ".".join(p for p in rel.parts if p != "__init__")
        for name, node in _public_functions(path.read_text(), str(path)):
            if node.returns is not None and _UNTYPED.search(ast.unparse(node.returns)):
                found.append(f"{module}.{name}")
    return found


def test_the_admin_surface_answers_records_not_dicts() -> None:
    found = set(untyped_returns())
    unlisted = found - set(UNTYPED_ALLOWED)
    assert not unlisted, (
        f"answer a record (protocol/) instead of a dict, or list it here with why: "
        f"{sorted(unlisted)}"
    )
    stale = set(UNTYPED_ALLOWED) - found
    assert not stale, f"allowed but no longer untyped (drop them): {sorted(stale)}"
    assert len(UNTYPED_ALLOWED) <= UNTYPED_BOUND


def test_the_untyped_walk_sees_what_it_must() -> None:
    """The walk finds an untyped answer in each form it takes, and skips private names."""
    source = (
        "from typing import Any\n"
        "def a() -> dict[str, Any]: ...\n"
        "def b() -> list[dict[str, Any]]: ...\n"
        "def c() -> JSONObject: ...\n"
        "def d() -> dict[str, JSON] | None: ...\n"
        "def _e() -> dict[str, Any]: ...\n"
        "def f() -> dict[str, int]: ...\n"
        "class K:\n"
        "    async def g(self) -> dict[str, Any]: ...\n"
        "class _P:\n"
        "    def h(self) -> dict[str, Any]: ...\n"
    )
    names = [
        name
        for name, node in _public_functions(source, "example.py")
        if node.returns is not None and _UNTYPED.search(ast.unparse(node.returns))
    ]
    assert names == ["a", "b", "c", "d", "K.g"]
