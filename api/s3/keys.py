"""The S3 app's own state, by typed AppKey (the engine's keys are api/keys.py's)."""

from __future__ import annotations

from aiohttp import web

from .state import S3State

STATE = web.AppKey("s3_state", S3State)
MAIN = web.AppKey("s3_main", web.Application)  # the JSON API's app: its cluster session
