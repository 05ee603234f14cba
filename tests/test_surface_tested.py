"""Every `ckpt` command and every public client method is run by some test.

The surface is read from the code: the command paths from `cli.build_parser()` (a command
with sub-actions counts as each sub-action: `token rotate`, `tier plan`), the methods from
`VaultClient` and `AsyncVaultClient` (public, callable, not inherited from `object`). The
tests are read as source (ast), never run, so this test costs a second. The rules:

- A command runs when a test passes its words as the leading string literals of a `ckpt`
  argument list. An argument list is a list, tuple or call that holds `"-m", CLI` (the
  words follow, after the global `--url`/`--token` options and their values); a list passed
  to `main(...)`; or the call, by its bare name, of a *runner*: a module-level function of a
  test module (not a test) whose body holds such a list or calls another runner
  (`ckpt(server, "token", "rotate")`: the words follow the non-literal leading arguments;
  runners are known by name across modules, as one module may import another's). A word
  held in a variable does not count: a command chosen by `parametrize` must be spelled out
  somewhere else too.
- A method runs when a test calls it on a name bound to a client in the same function or an
  enclosing one, or at module level: `with VaultClient(...) as vault`, `c = AsyncVaultClient(
  ...)`, a parameter or variable annotated `VaultClient`/`AsyncVaultClient` (the `vault`
  fixture), or directly on the constructor call. `VaultClient`'s methods are generated twins
  that run `AsyncVaultClient`'s, so a method is covered by a call on either face.

A test that may be skipped (a skip mark, `skipif`, a `pytest.skip` call in its body, a
module whose `pytestmark` skips) counts for nothing: a call there is not a call that runs.

The tests that hold these calls run against a real server (tests/serverproc.py or the app
in process); this test checks only that the call exists, and names what has none.
"""

from __future__ import annotations

import argparse
import ast
import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint_vault.cli import build_parser
from checkpoint_vault.client import AsyncVaultClient, VaultClient

TESTS = Path(__file__).resolve().parent
CLIENT_CLASSES = frozenset({"VaultClient", "AsyncVaultClient"})
GLOBAL_OPTIONS = frozenset({"--url", "--token"})  # each takes a value
CLI = "checkpoint_vault.cli"  # `python -m` this runs `ckpt`


def command_paths(parser: argparse.ArgumentParser) -> set[tuple[str, ...]]:
    """Every runnable command path of the parser: ("serve",), ("token", "rotate"), ..."""

    def walk(p: argparse.ArgumentParser, prefix: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            yield prefix
        for action in subs:
            for name, child in action.choices.items():
                yield from walk(child, (*prefix, name))

    return set(walk(parser, ()))


def public_methods(cls: type) -> set[str]:
    return {
        name
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and callable(member) and not hasattr(object, name)
    }


# -- commands -------------------------------------------------------------------------------
def _elements(node: ast.AST) -> list[ast.expr] | None:
    if isinstance(node, ast.List | ast.Tuple):
        return list(node.elts)
    if isinstance(node, ast.Call):
        return list(node.args)
    return None


def _literal(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _after_module_flag(elts: list[ast.expr]) -> list[ast.expr] | None:
    """The elements after `"-m", CLI`, or None if the sequence does not hold it."""
    texts = [_literal(e) for e in elts]
    for i in range(len(texts) - 1):
        if texts[i] == "-m" and texts[i + 1] == CLI:
            return elts[i + 2 :]
    return None


def _words(elts: list[ast.expr]) -> tuple[str, ...]:
    """The leading string literals, after non-literal leading elements and global options."""
    i = 0
    while i < len(elts) and _literal(elts[i]) is None and not isinstance(elts[i], ast.Starred):
        i += 1
    while i < len(elts) and _literal(elts[i]) in GLOBAL_OPTIONS:
        i += 2
    words: list[str] = []
    for e in elts[i:]:
        text = _literal(e)
        if text is None:
            break
        words.append(text)
    return tuple(words)


def _callee(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _runner_call(call: ast.Call, runners: set[str]) -> bool:
    """A call of a runner: by its bare name, as a module-level function is called (so
    `subprocess.run(...)` is never taken for a runner named `run`)."""
    return isinstance(call.func, ast.Name) and call.func.id in runners


def _runs_cli(node: ast.AST, runners: set[str]) -> bool:
    for sub in ast.walk(node):
        elts = _elements(sub)
        if elts is not None and _after_module_flag(elts) is not None:
            return True
        if isinstance(sub, ast.Call) and (_callee(sub) == "main" or _runner_call(sub, runners)):
            return True
    return False


def cli_runners(trees: list[ast.Module]) -> set[str]:
    """Names of the runners: module-level functions, not tests, that run `ckpt` themselves
    or through another runner (`js` calls `ckpt`). Taken across modules: one may import
    another's."""
    functions = [
        n
        for tree in trees
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and not n.name.startswith("test")
    ]
    runners: set[str] = set()
    grew = True
    while grew:
        grew = False
        for f in functions:
            if f.name not in runners and _runs_cli(f, runners):
                runners.add(f.name)
                grew = True
    return runners


def invoked_commands(tree: ast.Module, runners: set[str]) -> set[tuple[str, ...]]:
    """The word sequences a module hands to `ckpt` (see the module docstring)."""
    found: set[tuple[str, ...]] = set()
    for node in ast.walk(tree):
        elts = _elements(node)
        if elts is None:
            continue
        after = _after_module_flag(elts)
        if after is not None:
            found.add(_words([ast.Constant(None), *after]))
        if isinstance(node, ast.Call) and _callee(node) == "main" and node.args:
            listed = _elements(node.args[0])
            if isinstance(node.args[0], ast.List) and listed is not None:
                found.add(_words([ast.Constant(None), *listed]))
        elif isinstance(node, ast.Call) and _runner_call(node, runners):
            found.add(_words(elts))
    return found


def covered(path: tuple[str, ...], invoked: set[tuple[str, ...]]) -> bool:
    return any(words[: len(path)] == path for words in invoked)


# -- client methods ---------------------------------------------------------------------------
def _is_client(node: ast.expr | None) -> bool:
    """An annotation or constructor naming a client class (`VaultClient`, `"VaultClient"`)."""
    if isinstance(node, ast.Name):
        return node.id in CLIENT_CLASSES
    if isinstance(node, ast.Attribute):
        return node.attr in CLIENT_CLASSES
    if isinstance(node, ast.Constant):
        return node.value in CLIENT_CLASSES
    if isinstance(node, ast.Call):
        return _is_client(node.func) or any(_is_client(a) for a in node.args)
    if isinstance(node, ast.Await):
        return _is_client(node.value)
    return False


def _client_names(scope: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(scope):
        if isinstance(node, ast.arg) and _is_client(node.annotation):
            names.add(node.arg)
        elif isinstance(node, ast.withitem) and _is_client(node.context_expr):
            if isinstance(node.optional_vars, ast.Name):
                names.add(node.optional_vars.id)
        elif isinstance(node, ast.Assign) and _is_client(node.value):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and (_is_client(node.annotation) or _is_client(node.value))
        ):
            names.add(node.target.id)
    return names


def called_methods(tree: ast.Module) -> set[str]:
    """Methods called on a client in a module (see the module docstring)."""
    top = [n for n in tree.body if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    module_level = _client_names(ast.Module(body=top, type_ignores=[]))
    scopes: list[tuple[ast.AST, set[str]]] = [(tree, module_level)]
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            scopes.append((node, module_level | _client_names(node)))
    found: set[str] = set()
    for scope, names in scopes:
        for node in ast.walk(scope):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            receiver = node.func.value
            if (isinstance(receiver, ast.Name) and receiver.id in names) or (
                isinstance(receiver, ast.Call) and _is_client(receiver.func)
            ):
                found.add(node.func.attr)
    return found


# -- skipped tests ----------------------------------------------------------------------------
_SKIPS = frozenset({"skip", "skipif", "skipIf", "skipUnless"})


def _skips(node: ast.AST) -> bool:
    """A mark or decorator that may skip: `pytest.mark.skip(...)`, `skipif`, `unittest.skip`,
    a list of marks holding one."""
    if isinstance(node, ast.List | ast.Tuple):
        return any(_skips(e) for e in node.elts)
    target = node.func if isinstance(node, ast.Call) else node
    return isinstance(target, ast.Attribute) and target.attr in _SKIPS


def _may_skip(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Decorated with a skip, or calling `pytest.skip` anywhere in its body (a skip on a
    condition of the machine skips somewhere)."""
    if any(_skips(d) for d in function.decorator_list):
        return True
    return any(
        isinstance(n, ast.Call) and _callee(n) == "skip" and isinstance(n.func, ast.Attribute)
        for n in ast.walk(function)
    )


class _Unskipped(ast.NodeTransformer):
    """Drops the functions that may be skipped: a call there is not a call that runs."""

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST | None:
        return None if _may_skip(node) else self.generic_visit(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST | None:
        return None if _may_skip(node) else self.generic_visit(node)


def unskipped(tree: ast.Module) -> ast.Module:
    """`tree` without what may be skipped: nothing of a module whose `pytestmark` skips."""
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
            and _skips(node.value)
        ):
            return ast.Module(body=[], type_ignores=[])
    pruned = _Unskipped().visit(tree)
    assert isinstance(pruned, ast.Module)
    return pruned


# -- the tests ----------------------------------------------------------------------------
def _test_modules() -> list[ast.Module]:
    """Every test module but this one (its examples below are strings, not calls), without
    the tests that may be skipped."""
    return [
        unskipped(ast.parse(path.read_text(), str(path)))
        for path in sorted(TESTS.rglob("*.py"))
        if path.resolve() != Path(__file__).resolve()
    ]


@pytest.mark.slow
def test_every_ckpt_command_is_run_by_a_test() -> None:
    trees = _test_modules()
    runners = cli_runners(trees)
    invoked = set().union(*(invoked_commands(tree, runners) for tree in trees))
    missing = sorted(" ".join(p) for p in command_paths(build_parser()) if not covered(p, invoked))
    assert missing == [], f"ckpt commands no test runs: {missing}"


@pytest.mark.slow
def test_every_public_client_method_is_called_by_a_test() -> None:
    called = set().union(*(called_methods(tree) for tree in _test_modules()))
    surface = public_methods(VaultClient) | public_methods(AsyncVaultClient)
    missing = sorted(surface - called)
    assert missing == [], f"client methods no test calls: {missing}"


def test_the_rules_see_what_they_claim() -> None:
    """The scanner on examples of each rule, and on near misses it must not count."""
    source = """
import subprocess, sys
def ckpt(server, *args):
    return subprocess.run([sys.executable, "-m", "checkpoint_vault.cli", *args])
def js(server, *args):
    return ckpt(server, *args, "--json")
def helper(x, *args):
    return x
def test(server, vault: VaultClient, command):
    js(server, "token", "rotate", "reader")
    ckpt(server, command, "--data", "d")
    helper(server, "audit")
    tools.js(server, "audit")
    subprocess.run([sys.executable, "-m", "checkpoint_vault.cli", "--url", u, "--token", t,
                    "key", "add"])
    main(["catalog", "backup"])
    vault.tag("ns", "id", [])
    with AsyncVaultClient(u) as other:
        other.audit()
    engine.verify()
def test_other(vault):
    vault.rotate_token("x")
@pytest.mark.skipif(os.geteuid() != 0, reason="root")
def test_as_root(server, vault: VaultClient):
    js(server, "gc")
    vault.stats()
def test_needs_docker(server):
    if not shutil.which("docker"):
        pytest.skip("no docker")
    js(server, "serve")
"""
    tree = unskipped(ast.parse(source))
    runners = cli_runners([tree])
    assert runners == {"ckpt", "js"}
    invoked = invoked_commands(tree, runners)
    assert invoked == {
        ("token", "rotate", "reader"),
        ("key", "add"),
        ("catalog", "backup"),
        ("--data", "d"),  # words after a variable: prefixes no command
        (),
    }
    assert covered(("token", "rotate"), invoked)
    assert not covered(("audit",), invoked)
    assert called_methods(tree) == {"tag", "audit"}
    skipped_module = "pytestmark = [pytest.mark.skip]\ndef test(s):\n    js(s, 'gc')\n"
    assert unskipped(ast.parse(skipped_module)).body == []
