"""api/receive.py takes request bodies past aiohttp's parser, with three of its internals:
`request.writer.output_size`, `request.content.feed_eof()` and `request.protocol.close()`.
pyproject.toml bounds aiohttp to the minor release they were read from; this keeps the
bound and the installed version in step and names the internals, so a new aiohttp fails
here with a reason rather than as a stalled body in tests/integration/test_receive.py."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

from aiohttp import streams, web_protocol
from aiohttp.http_writer import StreamWriter

ROOT = Path(__file__).resolve().parents[3]


def _minor(text: str) -> tuple[int, int]:
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


def test_installed_aiohttp_is_within_the_bound_pyproject_declares() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    server = text[text.index("\nserver = [") :]
    found = re.search(r'"aiohttp>=([\d.]+),<([\d.]+)"', server[: server.index("]")])
    assert found, "the server extra must bound aiohttp from above"
    low, high = _minor(found[1]), _minor(found[2])
    assert high == (low[0], low[1] + 1), "bound aiohttp to one minor release"
    assert low <= _minor(version("aiohttp")) < high


def test_the_internals_the_receive_path_uses_are_there() -> None:
    assert "output_size" in StreamWriter.__dict__ or hasattr(StreamWriter, "output_size")
    assert callable(streams.StreamReader.feed_eof)
    assert callable(web_protocol.RequestHandler.close)
