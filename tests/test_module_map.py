"""docs/DESIGN.md's module map names every module of every package, once.

A newcomer finds a module's role there before opening it; a map that misses modules
(protocol/_maintenance.py and _text.py were, for a while) sends them to the code instead.
"""

from __future__ import annotations

import re
from pathlib import Path

from .test_quality import PACKAGES

ROOT = Path(__file__).resolve().parent.parent


def mapped(package: str) -> list[str]:
    """The modules the package's part of the map names, as paths inside the package: a
    heading `#### vault/content/` prefixes the rows under it; a row may name several
    modules of one directory (`importers/_hf.py`, `_dcp.py`)."""
    text = (ROOT / "docs" / "DESIGN.md").read_text()
    at = text.index("## Module map")
    section = text[at : text.index("\n## ", at)]
    start = section.index(f"### `{package}/`")
    end = section.find("\n### ", start + 1)
    names: list[str] = []
    prefix = ""
    for line in section[start : end if end > 0 else None].splitlines():
        if heading := re.match(rf"#### `{package}/([\w/]+/)`", line):
            prefix = heading[1]
        elif line.startswith("| `"):
            first = line.split(" | ")[0]
            found = re.findall(r"`([\w/.]+\.py)`", first)
            folder = found[0].rpartition("/")[0] + "/" if "/" in found[0] else ""
            names += [prefix + (n if "/" in n else folder + n) for n in found]
    return names


def modules(package: str) -> list[str]:
    return sorted(str(p.relative_to(ROOT / package)) for p in (ROOT / package).rglob("*.py"))


def required(module: str) -> bool:
    """A subpackage's `__init__.py` may go unnamed: its heading stands for it."""
    return module == "__init__.py" or not module.endswith("/__init__.py")


def test_every_module_has_one_line_in_the_map() -> None:
    problems = {}
    for package in PACKAGES:
        listed = mapped(package)
        missing = sorted({m for m in modules(package) if required(m)} - set(listed))
        gone = sorted(set(listed) - set(modules(package)))
        twice = sorted({m for m in listed if listed.count(m) > 1})
        if missing or gone or twice:
            problems[package] = {"missing": missing, "gone": gone, "twice": twice}
    assert not problems, problems
