"""The application's state, by typed AppKey: one leaf module every api module may import.

It imports only aiohttp, the standard library, vault, maintenance and other leaf modules
of api/ (never `api.app`), so route, scheduler and promotion modules reach the app's state
without an import circle through the factory. `api/app.py` fills these keys in `create_app` and its
cleanup context.
"""

from __future__ import annotations

from aiohttp import web

from checkpoint_vault.maintenance import MaintenanceQueue
from checkpoint_vault.vault import Clock, Vault
from checkpoint_vault.vault.runtime import Runtime

from .auth import TokenCache
from .heads import Unheaded
from .observability import JobLog, Metrics
from .process import Role
from .ratelimit import RateLimiter
from .saving import SaveSink
from .settings import Settings
from .transfer.bodies import BodyReaders
from .turns import Turns

SETTINGS = web.AppKey("settings", Settings)
INSTANCE = web.AppKey("instance", str)  # random per start: tells servers on one machine apart
VAULT = web.AppKey("vault", Vault)
RUNTIME = web.AppKey("runtime", Runtime)  # every pool and thread (vault/runtime.py)
TOKENS = web.AppKey("tokens", TokenCache)
CLOCK = web.AppKey("clock", Clock)
BODY_READERS = web.AppKey("body_readers", BodyReaders)
TURNS = web.AppKey("turns", Turns)  # each token's share of the worker pool (api/turns.py)
JOBS = web.AppKey("jobs", JobLog)
ROLE = web.AppKey("role", Role)  # which process, as far as routes ask
SAVES = web.AppKey("saves", SaveSink)  # where routes' one-request saves are committed
METRICS = web.AppKey("metrics", Metrics)
LIMITER = web.AppKey("limiter", RateLimiter)
UNHEADED = web.AppKey("unheaded", Unheaded)  # connections without a request head yet
# Where maintenance tasks wait, and the thread that runs them (api/jobs.py).
QUEUE = web.AppKey("maintenance_queue", MaintenanceQueue)

__all__ = [
    "BODY_READERS",
    "CLOCK",
    "INSTANCE",
    "JOBS",
    "LIMITER",
    "METRICS",
    "QUEUE",
    "RUNTIME",
    "ROLE",
    "SAVES",
    "SETTINGS",
    "TOKENS",
    "TURNS",
    "UNHEADED",
    "VAULT",
]
