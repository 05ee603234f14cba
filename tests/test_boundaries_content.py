"""The content layer is the one home of chunk locations and packs: checked by reading code.

tiering/ plans and drives moves through the engine's public API (`Vault`, `vault.content`,
the snapshot, the tier protocol); it never reaches the store, the writer, LMDB or the
tables behind a location. And no module outside vault/content/ knows how a location is
encoded on disk.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What tiering/ may import from the engine.
ENGINE_API = {
    "vault",
    "vault.content",
    "vault.content.chunks",  # ChunkMeta, the type a snapshot hands out
    "vault.errors",
    "vault.files",  # fsync_dir: a file-system step, no engine state
    "vault.maintenance",
    "vault.manifest",
    "vault.policy",
    "vault.seal",
    "vault.snapshot",
    "vault.tier",
}
PRIVATE_NAMES = ("_INLINE_BIT", "_SEQ_PACKED", "PACKED", '"packed"', '"inline"', '"inline_frames"')


def _imports(path: Path) -> set[str]:
    """Absolute imports, ours by folder (`checkpoint_vault.vault.errors` -> `vault.errors`)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            if node.module == "checkpoint_vault":
                out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {m.removeprefix("checkpoint_vault.") for m in out} - {"checkpoint_vault"}


def test_tiering_uses_only_the_engine_api() -> None:
    bad = {
        f"{path.relative_to(ROOT)}: {module}"
        for path in (ROOT / "tiering").rglob("*.py")
        for module in _imports(path)
        if module.startswith("vault") and module not in ENGINE_API
    }
    assert not bad, sorted(bad)


def test_tiering_never_touches_the_store_or_writer() -> None:
    bad = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "tiering").rglob("*.py")
        if any(s in path.read_text() for s in (".store.", ".store\n", "WriteTxn", ".env."))
    ]
    assert not bad


def test_location_encoding_stays_in_the_content_layer() -> None:
    content = ROOT / "vault" / "content"
    bad = []
    for package in ("vault", "tiering", "api"):
        for path in (ROOT / package).rglob("*.py"):
            if content in path.parents or path.name == "env.py":  # env.py declares tables
                continue
            text = path.read_text()
            bad += [f"{path.relative_to(ROOT)}: {n}" for n in PRIVATE_NAMES if n in text]
    assert not bad, bad
