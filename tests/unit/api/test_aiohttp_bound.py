"""The service reaches past aiohttp's public API in a few places; each is named here.

- api/transfer/receive.py takes request bodies past aiohttp's parser: `request.writer.output_size`
  (a 100 Continue is not part of the answer), `request.content.read_nowait()`,
  `request.content.feed_eof()` and `request.protocol.close()`;
- node/handoff.py hands a connection to the writing process and adopts it there: it
  rebuilds the head from `request.raw_headers`, drains `request.content.read_nowait()`,
  closes with `request.protocol.close()`, and in the writing process feeds the bytes to a
  `web_protocol.RequestHandler` made by `runner.server` through its asyncio protocol
  methods (connection_made, data_received, eof_received, connection_lost, pause_writing,
  resume_writing);
- api/errors.py closes a connection after an answer with `request.protocol.force_close()`.
pyproject.toml bounds aiohttp to the minor release they were read from; this keeps the
bound and the installed version in step and checks each internal is still there, so a new
aiohttp fails here with a reason rather than as a stalled body or a lost hand-over in the
integration tests."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

from aiohttp import streams, web_protocol, web_request, web_runner
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
    assert callable(streams.StreamReader.read_nowait)
    assert callable(web_protocol.RequestHandler.close)
    assert callable(web_protocol.RequestHandler.force_close)


def test_the_internals_the_hand_over_uses_are_there() -> None:
    handler = web_protocol.RequestHandler
    for method in (
        "connection_made",
        "data_received",
        "eof_received",
        "connection_lost",
        "pause_writing",
        "resume_writing",
    ):
        assert callable(getattr(handler, method)), method
    assert "raw_headers" in web_request.BaseRequest.__dict__  # a cached property
    assert isinstance(web_runner.BaseRunner.server, property)
