"""Fixtures of the browser tests: one Chromium and one real server per module, the server
holding the namespace `web/demo` the issue describes (12 live checkpoints: a fork, one
invalid, one deleted parent left as a tombstone, a tag holding markup), and tokens: the
bootstrap admin and a read-only one."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from checkpoint_vault.client import VaultClient

from ..serverproc import ServerProcess, free_port
from .chromium import FLAGS, ensure_chromium

NS = "web/demo"
HIDDEN = "private/x"
# Markup a browser would run if the page put it through innerHTML: the tests expect to see
# it as text and `window.__xss` to stay undefined.
SCRIPT_TAG = '<script>window.__xss=1</script><img src=x onerror="window.__xss=1">'
INVALID_REASON = "loss diverged at step 700"


@dataclass
class Demo:
    server: ServerProcess
    admin: str  # token
    reader: str  # token: read:web/* only
    ids: dict[str, str]  # label -> checkpoint id
    invalid: str
    deleted: str

    @property
    def ui(self) -> str:
        return f"{self.server.url}/ui/"


def _seed(vault: VaultClient, server: ServerProcess) -> tuple[dict[str, str], str]:
    """Main line m1..m10, m3 then deleted (m4's parent becomes a tombstone), a fork f1 of
    m5 with a child f2, and m11 after m10: 12 live checkpoints. A usage scan after every
    third save gives the storage chart a few points."""
    ids: dict[str, str] = {}
    parent: str | None = None
    for i in range(1, 11):
        tags = {1: ["baseline"], 8: [SCRIPT_TAG], 10: ["best"]}.get(i, [])
        rec = vault.save(
            NS,
            {"model.bin": os.urandom(2048) + bytes(4096 * i), "config.json": b'{"lr": 0.001}'},
            parent=parent,
            metadata={"step": i * 100, "loss": round(2.0 / i, 3)},
            tags=tags,
        )
        ids[f"m{i}"] = parent = rec.id
        if i % 3 == 0:
            _scan(vault, server)
    fork = vault.fork(
        NS, ids["m5"], NS, metadata={"step": 500, "branch": "lr-sweep"}, tags=["fork"]
    )
    ids["f1"] = fork.id
    ids["f2"] = vault.save(
        NS, {"model.bin": os.urandom(1024)}, parent=fork.id, metadata={"step": 600}
    ).id
    ids["m11"] = vault.save(
        NS, {"model.bin": os.urandom(1024)}, parent=ids["m10"], metadata={"step": 1100}
    ).id
    vault.mark_invalid(NS, ids["m7"], INVALID_REASON)
    vault.delete(NS, ids["m3"])
    deleted = ids.pop("m3")
    vault.set_policy(NS, {"retention": {"keep_last": 4, "keep_tags": ["baseline"]}})
    vault.save(HIDDEN, {"secret.bin": b"s" * 100})  # a namespace the read-only token lacks
    return ids, deleted


def _samples_of_demo(server: ServerProcess) -> int:
    req = urllib.request.Request(
        f"{server.url}/v1/stats/history", headers={"Authorization": f"Bearer {server.token}"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback http
        return sum(NS in s["namespaces"] for s in json.load(resp)["samples"])


def _scan(vault: VaultClient, server: ServerProcess) -> None:
    """A usage scan, which takes a storage sample before it answers (Vault.usage)."""
    before = _samples_of_demo(server)
    vault.stats(namespaces=True)
    assert _samples_of_demo(server) == before + 1, "no storage sample of web/demo"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    root = tmp_path_factory.mktemp("console")
    server = ServerProcess(root / "data", free_port(), root / "server.log")
    server.start()
    try:
        with VaultClient(server.url, server.token, local_files=False) as vault:
            ids, deleted = _seed(vault, server)
            reader = vault.create_token("viewer", ["read:web/*"]).token
            _scan(vault, server)
        yield Demo(server, server.token, reader, ids, ids["m7"], deleted)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = ensure_chromium()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, headless=True, args=list(FLAGS))
        try:
            yield b
        finally:
            b.close()


@dataclass
class Watched:
    """A page and what went wrong in it: uncaught errors and console errors (a CSP
    violation is reported as one)."""

    page: Page
    errors: list[str]


@pytest.fixture
def watched(browser: Browser) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(15_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    page.on(
        "response",
        lambda r: (
            errors.append(f"{r.status} {r.request.method} {r.url}") if r.status >= 400 else None
        ),
    )
    try:
        yield Watched(page, errors)
    finally:
        context.close()


def screenshot(page: Page, name: str) -> None:
    """Save a screenshot for docs/ when CKPT_SCREENSHOTS names a directory."""
    target = os.environ.get("CKPT_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(target) / f"{name}.png"), full_page=True)
