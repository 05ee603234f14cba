"""`ckpt ls` and `ckpt show` print strings others wrote (issue 30, finding 11): a tag or
metadata holding ESC, CR or LF reached the operator's terminal raw, where `ESC ]0;` retitles
the window, `ESC [2J` clears it and CR/LF forge table rows. They print escaped now."""

from __future__ import annotations

from pathlib import Path

from ..serverproc import ServerProcess
from .test_cli import ckpt

HOSTILE = "ok\x1b]0;pwned\x07\x1b[2J\rforged\nrow\x9b\u202e"


def test_ls_and_show_escape_control_characters(server: ServerProcess, tmp_path: Path) -> None:
    src = tmp_path / "model.bin"
    src.write_bytes(b"weights")
    cid = ckpt(
        server, "push", "term/run", str(src), "--tag", HOSTILE, "--meta", f"note={HOSTILE}"
    ).stdout.strip()
    ckpt(server, "mark", "term/run", cid, "invalid", "--reason", HOSTILE)
    for args in (("ls", "term/run"), ("show", "term/run", cid)):
        out = ckpt(server, *args).stdout
        for raw in ("\x1b", "\x07", "\r", "\x9b", "\u202e"):
            assert raw not in out, (args, raw, out)
        assert "forged\nrow" not in out, out
        assert r"ok\x1b]0;pwned\x07\x1b[2J\x0dforged\x0arow\x9b\u202e" in out, out
