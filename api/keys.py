"""The application's state, by typed AppKey: one leaf module every api module may import.

It imports only aiohttp, the standard library, vault and other leaf modules of api/ (never
`api.app`), so route, scheduler and promotion modules reach the app's state without an
import circle through the factory. `api/app.py` fills these keys in `create_app` and its
cleanup context.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from vault import Clock, Vault

from .auth import TokenCache
from .bodies import BodyReaders
from .observability import JobLog, Metrics
from .ratelimit import RateLimiter
from .settings import Settings

SETTINGS = web.AppKey("settings", Settings)
INSTANCE = web.AppKey("instance", str)  # random per start: tells servers on one machine apart
VAULT = web.AppKey("vault", Vault)
POOL = web.AppKey("pool", ThreadPoolExecutor)  # bounded worker threads for engine calls
SENDERS = web.AppKey("senders", ThreadPoolExecutor)  # threads copying download bodies out
RECEIVERS = web.AppKey("receivers", ThreadPoolExecutor)  # threads taking large bodies in
# Threads reading and writing files handed over by descriptor (api/receive.py)
HANDOVERS = web.AppKey("handovers", ThreadPoolExecutor)
TOKENS = web.AppKey("tokens", TokenCache)
CLOCK = web.AppKey("clock", Clock)
BODY_READERS = web.AppKey("body_readers", BodyReaders)
JOBS = web.AppKey("jobs", JobLog)
METRICS = web.AppKey("metrics", Metrics)
LIMITER = web.AppKey("limiter", RateLimiter)

__all__ = [
    "BODY_READERS",
    "CLOCK",
    "INSTANCE",
    "JOBS",
    "LIMITER",
    "METRICS",
    "POOL",
    "RECEIVERS",
    "HANDOVERS",
    "SETTINGS",
    "TOKENS",
    "VAULT",
]
