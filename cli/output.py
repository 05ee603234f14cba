"""Printing results: JSON for machines, aligned tables for people.

Strings others wrote (tags, file names, validity reasons, metadata, server messages) reach
a terminal here, so everything printed for people goes through `printable`: an ESC in a tag
could recolour, retitle or rewrite the operator's terminal, and a CR or LF forge table rows.
JSON output needs nothing: `json.dump` escapes every control character."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from typing import Any

from checkpoint_vault.protocol import UNPRINTABLE


def emit_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


def printable(text: str) -> str:
    """`text` safe to print on a terminal: control characters shown as `\\x1b`-style escapes."""
    return UNPRINTABLE.sub(_escape, text)


def _escape(m: re.Match[str]) -> str:
    code = ord(m.group())
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(h) for h in headers]] + [[printable(_fmt(c)) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def human_bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) or "-"
    return str(value)
