"""The event loop each server process runs: uvloop's where it is installed.

A small save crosses three event loops (the worker's, the writing process's twice) and
aiohttp's request handling; on asyncio's own loop their bookkeeping was a measurable share
of the server's CPU per save (docs/SCALING.md). uvloop runs the same code on libuv. It is
a dependency of the `server` extra where it has wheels; elsewhere, with TLS, or with
`[server] event_loop = "asyncio"` (to rule it out when chasing a problem), the standard
loop runs. Only the server's processes choose: the client library never sets a loop for
the program that imports it.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)

LOOPS = ("uvloop", "asyncio")


def new_loop(kind: str, *, tls: bool = False) -> asyncio.AbstractEventLoop:
    """A new event loop of `kind` (one of LOOPS); asyncio's if uvloop is not installed, or
    for a server speaking TLS: uvloop's TLS transport cut file downloads (`loop.sendfile`
    through it) short in tests/integration/test_tls.py. A TLS server is one process
    anyway (api/settings.py `processes`)."""
    if kind == "uvloop" and not tls:
        try:
            import uvloop
        except ImportError:
            log.warning("uvloop is not installed: the standard asyncio event loop runs")
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()
