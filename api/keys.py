"""The application's state, by typed AppKey: one leaf module every api module may import.

It imports only aiohttp, the standard library, vault, maintenance and other leaf modules
of api/ (never `api.app`), so route, scheduler and promotion modules reach the app's state
without an import circle through the factory. `api/app.py` fills these keys in `create_app` and its
cleanup context.
"""

from __future__ import annotations

from aiohttp import web
from checkpoint_vault.node.calls import CallServer
from checkpoint_vault.node.forward import Forwarder
from checkpoint_vault.node.handoff import Adopted

from checkpoint_vault.maintenance import MaintenanceQueue
from checkpoint_vault.vault import Clock, Vault
from checkpoint_vault.vault.runtime import Runtime

from .auth import TokenCache
from .heads import Unheaded
from .observability import JobLog, Metrics
from .ratelimit import RateLimiter
from .saving import SaveSink
from .settings import Settings
from .transfer.bodies import BodyReaders
from .turns import Turns

SETTINGS = web.AppKey("settings", Settings)
INSTANCE = web.AppKey("instance", str)  # random per start: tells servers on one machine apart
# The writing process's listening sockets for each of its workers (inherited by them).
LISTENING = web.AppKey("listening", list)
WORKER = web.AppKey("worker", int)  # which process of the service: 0 writes, 1.. read (workers)
VAULT = web.AppKey("vault", Vault)
RUNTIME = web.AppKey("runtime", Runtime)  # every pool and thread (vault/runtime.py)
TOKENS = web.AppKey("tokens", TokenCache)
CLOCK = web.AppKey("clock", Clock)
BODY_READERS = web.AppKey("body_readers", BodyReaders)
TURNS = web.AppKey("turns", Turns)  # each token's share of the worker pool (api/turns.py)
JOBS = web.AppKey("jobs", JobLog)
CALLS = web.AppKey("calls", CallServer)  # the writing process's end of its workers' channel
SAVES = web.AppKey("saves", SaveSink)  # where routes' one-request saves are committed
FORWARDER = web.AppKey("forwarder", Forwarder)  # a worker's way to the writing process
METRICS = web.AppKey("metrics", Metrics)
LIMITER = web.AppKey("limiter", RateLimiter)
UNHEADED = web.AppKey("unheaded", Unheaded)  # connections without a request head yet
ADOPTED = web.AppKey("adopted", Adopted)  # the writing process's connections handed over
# Where maintenance tasks wait, and the thread that runs them (api/jobs.py).
QUEUE = web.AppKey("maintenance_queue", MaintenanceQueue)

__all__ = [
    "ADOPTED",
    "BODY_READERS",
    "CALLS",
    "CLOCK",
    "FORWARDER",
    "INSTANCE",
    "JOBS",
    "LIMITER",
    "LISTENING",
    "METRICS",
    "QUEUE",
    "RUNTIME",
    "SAVES",
    "SETTINGS",
    "TOKENS",
    "TURNS",
    "UNHEADED",
    "VAULT",
    "WORKER",
]
