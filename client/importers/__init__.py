"""Moving in and out: the checkpoints a team already has into the vault, and back out.

    from checkpoint_vault.client import VaultClient
    from checkpoint_vault.client.importers import export_series, import_series
    with VaultClient() as vault:
        report = import_series(vault, "output/", "runs/gpt2-ft")   # checkpoint-N/ dirs
        export_series(vault, "runs/gpt2-ft", "restored/")          # the same tree back

A directory series (`import_series`): Hugging Face Trainer output (`checkpoint-N/`),
Lightning `dirpath`s (`*.ckpt`), torch DCP directories (`.metadata`) or plain files named
by step, one checkpoint per entry in step order, each the child of the one before;
resumable, with a dry run. LangGraph histories (`import_langgraph` / `export_langgraph`):
a SqliteSaver file or a PostgresSaver database, thread by thread, served afterwards by
`client.langgraph.VaultSaver`. `ckpt import` and `ckpt export` run these; the guide is
docs/integrations/moving.md.

Importing this package is light: torch is imported only to read a Lightning file's
callback state, LangGraph only by the LangGraph functions.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._entries import IMPORTED_KEY, Entry
from ._export import ExportReport, export_series
from ._series import LAYOUTS, BadSource, ImportReport, Planned, detect_layout, import_series

if TYPE_CHECKING:
    from ._langgraph import (
        GraphExportReport,
        GraphImportReport,
        export_langgraph,
        import_langgraph,
    )

_LAZY = {
    "GraphExportReport": "_langgraph",
    "GraphImportReport": "_langgraph",
    "export_langgraph": "_langgraph",
    "import_langgraph": "_langgraph",
}


def __getattr__(name: str) -> Any:
    """The LangGraph names on first use, importing langgraph then (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "IMPORTED_KEY",
    "LAYOUTS",
    "BadSource",
    "Entry",
    "ExportReport",
    "GraphExportReport",
    "GraphImportReport",
    "ImportReport",
    "Planned",
    "detect_layout",
    "export_langgraph",
    "export_series",
    "import_langgraph",
    "import_series",
]
