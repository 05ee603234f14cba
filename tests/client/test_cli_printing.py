"""`ckpt ls` and `ckpt show` print strings others wrote (issue 30, finding 11): a tag or
metadata holding ESC, CR or LF reached the operator's terminal raw, where `ESC ]0;` retitles
the window, `ESC [2J` clears it and CR/LF forge table rows. They print escaped now, and the
server refuses such a tag in the first place."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpoint_vault.cli.output import table

from ..serverproc import ServerProcess
from .test_cli import ckpt

HOSTILE = "ok\x1b]0;pwned\x07\x1b[2J\rforged\nrow\x9b\u202e"


def test_tables_escape_control_characters(capsys: pytest.CaptureFixture[str]) -> None:
    """What `ckpt ls` and `show` print goes through `table`: strings of older data (tags
    stored before the server refused them) and server messages print escaped."""
    table(["tags"], [[HOSTILE]])
    out = capsys.readouterr().out
    for raw in ("\x1b", "\x07", "\r", "\x9b", "\u202e"):
        assert raw not in out, (raw, out)
    assert "forged\nrow" not in out, out
    assert r"ok\x1b]0;pwned\x07\x1b[2J\x0dforged\x0arow\x9b\u202e" in out, out


def test_a_tag_with_a_control_character_is_refused(server: ServerProcess, tmp_path: Path) -> None:
    src = tmp_path / "model.bin"
    src.write_bytes(b"weights")
    refused = ckpt(server, "push", "term/tags", str(src), "--tag", HOSTILE, ok=False)
    assert refused.returncode != 0
    assert "U+001B" in refused.stderr  # named, and escaped where it is printed
    assert "\x1b" not in refused.stderr
