"""The service's side of a vault's role (vault/vault.py): a standby or a fenced primary.

The engine refuses their changes where every change enters (the writer), with typed errors
the one error middleware maps (`read_only`, `fenced`: both 409). The middleware here asks the
engine the same question before a handler reads a body, so a refused 1 GiB upload costs one
round trip, not a gigabyte: every method but GET, HEAD and OPTIONS is refused, except the
promotion itself. A standby's token table changes under it (tokens are replicated); the
watcher reloads the service's in-memory copy after each change the standby applies.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.typedefs import Middleware

from checkpoint_vault.vault import Vault

from .errors import Handler
from .keys import TOKENS, VAULT

PROMOTE = "/v1/admin/promote"
_READS = frozenset({"GET", "HEAD", "OPTIONS"})


def read_only_middleware() -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method not in _READS and request.path != PROMOTE:
            request.app[VAULT].roles.require_writable()
        return await handler(request)

    return middleware


def follow_tokens(app: web.Application, vault: Vault) -> None:
    """Keep `app[TOKENS]` at the tokens a standby applies (from the follower's thread)."""
    standby = vault.roles.standby
    if standby is None:
        return
    loop = asyncio.get_running_loop()

    def reload(touched: set[str]) -> None:
        if "tokens" in touched or "*" in touched:
            tokens = vault.tokens.all()
            loop.call_soon_threadsafe(app[TOKENS].reload, tokens)

    standby.watch(reload)
    app[TOKENS].reload(vault.tokens.all())  # what changed before the watch began
