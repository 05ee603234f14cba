"""The process layer's state, by typed AppKey: set by the roles' factories (node/writer.py,
node/worker.py) and read in node/ alone. The HTTP core's keys are api/keys.py."""

from __future__ import annotations

from aiohttp import web

from .calls import CallServer
from .forward import Forwarder
from .handoff import Adopted

CALLS = web.AppKey("calls", CallServer)  # the writing process's end of its workers' channel
FORWARDER = web.AppKey("forwarder", Forwarder)  # a worker's way to the writing process
ADOPTED = web.AppKey("adopted", Adopted)  # the writing process's connections handed over

__all__ = ["ADOPTED", "CALLS", "FORWARDER"]
