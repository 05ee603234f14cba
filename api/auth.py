"""Bearer-token authentication and scope checks.

Scopes: `admin` (everything), `read:<glob>`, `write:<glob>`, `delete:<glob>`, where the glob
is matched against the namespace with fnmatch rules. `write` is append-only: it never reads
file contents and never deletes, so a leaked producer token cannot erase history.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Middleware

from checkpoint_vault.protocol import CheckpointWritten, LineageEntry
from checkpoint_vault.vault import Clock, InvalidName, StoredCheckpoint, Token
from checkpoint_vault.vault.names import check_namespace
from checkpoint_vault.vault.tokens import verify

from .errors import ApiError, Forbidden, Handler, Unauthorized
from .ratelimit import RateLimiter

PUBLIC_PATHS = frozenset({"/v1/health", "/v1/cluster/primary", "/ui"})
# The web console's page and static files (api/routes/ui.py; `/ui` redirects to `/ui/`):
# they hold no data, and a browser fetching a script cannot add a token; every API call
# the page makes carries one.
PUBLIC_PREFIXES = ("/ui/",)
SIGV4 = "AWS4-HMAC-SHA256 "  # an `Authorization` signed with a token's S3 key


@dataclass(frozen=True)
class Principal:
    name: str
    scopes: tuple[str, ...]

    @property
    def is_admin(self) -> bool:
        return "admin" in self.scopes

    def domain(self) -> Callable[[str], bool] | None:
        """The namespaces whose chunks this caller may dedup against (vault/domains.py):
        those it may read or write; None (everything) for admin."""
        if self.is_admin:
            return None
        return lambda ns: self.may("read", ns) or self.may("write", ns)

    def may(self, action: str, ns: str) -> bool:
        if self.is_admin:
            return True
        prefix = action + ":"
        return any(
            s.startswith(prefix) and fnmatch.fnmatchcase(ns, s[len(prefix) :]) for s in self.scopes
        )


class TokenCache:
    """In-memory copy of the token table (key id -> token), refreshed on every change.

    Last-use times are kept here (a catalog write per request would cost every request a
    sync) and flushed to the catalog when tokens are listed and at shutdown; a SIGKILL
    loses those since the last flush.
    """

    def __init__(self, tokens: list[Token], clock: Clock) -> None:
        self.by_key: dict[str, Token] = {}
        # Tokens presented and verified since the table last changed, by the presented
        # string: a client sends its token on every request, and hashing it again each time
        # was most of an authentication. Only a match is kept (at most one entry a token),
        # and any change to the table (a revocation, a rotation) empties it.
        self._verified: dict[str, tuple[Token, Principal]] = {}
        self.last_used: dict[str, float] = {}  # key id -> time, since the last flush
        self._clock = clock
        self._source: tuple[Callable[[], int], Callable[[], list[Token]]] | None = None
        self._seen = 0
        self.reload(tokens)

    def reload(self, tokens: list[Token]) -> None:
        self.by_key = {t.key_id: t for t in tokens}
        self._verified = {}

    def follow(self, changes: Callable[[], int], load: Callable[[], list[Token]]) -> None:
        """Reload from the catalog whenever `changes()` moves: in a worker process, whose
        tokens change in the process that writes (node/supervisor.py), a revocation must hold
        at the next request, not at a restart. One LMDB read per authentication."""
        self._source = (changes, load)
        self._seen = changes()
        self.reload(load())

    def refresh(self) -> None:
        """The table as the writing process has it now (`follow`); else nothing to do."""
        if self._source is not None:
            changes, load = self._source
            if (seen := changes()) != self._seen:
                self._seen = seen
                self.reload(load())

    def authenticate(self, header: str | None) -> Principal:
        if not header or not header.startswith("Bearer "):
            raise Unauthorized("missing 'Authorization: Bearer <token>' header")
        self.refresh()
        presented = header[7:].strip()
        known = self._verified.get(presented)
        if known is None:
            token = verify(self.by_key, presented)
            if token is None:
                raise Unauthorized("unknown or revoked token")
            known = self._verified[presented] = (token, Principal(token.name, token.scopes))
        token, who = known
        now = self._clock.now()
        if token.expired(now):
            raise Unauthorized(f"token {token.name!r} expired; ask an admin for a new one")
        self.last_used[token.key_id] = now
        return who

    def note_uses(self, last_used: dict[str, float]) -> None:
        """Uses seen elsewhere (a worker process's), kept with this cache's own."""
        for key, at in last_used.items():
            self.last_used[key] = max(at, self.last_used.get(key, at))

    def take_uses(self) -> dict[str, float]:
        """Last-use times gathered since the previous call (for `Tokens.record_use`)."""
        taken, self.last_used = self.last_used, {}
        return taken


PRINCIPAL = web.RequestKey("principal", Principal)


def principal(request: web.Request) -> Principal:
    try:
        return request[PRINCIPAL]
    except KeyError:
        raise Unauthorized("not authenticated") from None


def require(request: web.Request, action: str, ns: str) -> None:
    p = principal(request)
    if not p.may(action, ns):
        raise Forbidden(f"token {p.name!r} may not {action} namespace {ns!r}")


def visible_record(request: web.Request, rec: StoredCheckpoint) -> LineageEntry | CheckpointWritten:
    """What a change answers: the whole record to a caller that may read its namespace;
    to a write-only (append-only) token only the id of what it wrote, since metadata, file
    names, sizes and hashes (an `inherit` commit lists the parent's) are what GET refuses."""
    if principal(request).may("read", rec.namespace):
        return rec.to_protocol()
    return CheckpointWritten(rec.id, rec.namespace)


def require_admin(request: web.Request) -> None:
    p = principal(request)
    if not p.is_admin:
        raise Forbidden(f"token {p.name!r} lacks the admin scope")


def _check_path(request: web.Request) -> None:
    """Scopes are matched against the namespace in the path, so it must be the one the
    caller wrote and a valid one: the router resolves `.`/`..` segments (`a/../b` would
    act on `b`), and its namespace pattern admits anything, so a bad name answers 400
    invalid_name here rather than 404 no-such-route."""
    raw = request.raw_path.split("?", 1)[0]
    dotted = "/." in raw or raw.startswith(".")  # else no segment can be '.' or '..'
    if dotted and any(seg in (".", "..") for seg in raw.split("/")):
        raise InvalidName("'.' and '..' path segments are not allowed")
    ns = request.match_info.get("ns")
    if ns is not None:
        check_namespace(ns)


def _close_if_unread(request: web.Request, refused: ApiError) -> None:
    """A refused request whose body is unread ends its connection: aiohttp would read the
    body for up to 10 s first (lingering), so 2,000 unauthenticated heads announcing
    100 MB held a worker's descriptors at its bound while new connections waited."""
    if request.body_exists and not request.content.is_eof():
        refused.close_connection = True


def auth_middleware(
    cache_key: web.AppKey[TokenCache],
    limiter_key: web.AppKey[RateLimiter],
    charged: Callable[[web.Request], bool] | None = None,
    signed: Callable[[web.Request], Principal] | None = None,
) -> Middleware:
    """Authenticate every request but public ones, and charge the token's rate unless
    `charged(request)` says a worker did already (the writing process's side: what a
    worker forwarded or handed over was authenticated and charged there, and a request
    counted twice would halve a token's rate). `signed`: who sent a request signed with
    SigV4 instead (api/cluster/signed.py: an owner reading a part as an S3 caller), its
    rate charged there."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in PUBLIC_PATHS and not request.path.startswith(PUBLIC_PREFIXES):
            header = request.headers.get("Authorization")
            try:
                if signed is not None and header and header.startswith(SIGV4):
                    who = signed(request)
                else:
                    who = request.app[cache_key].authenticate(header)
                    if not who.is_admin and (charged is None or not charged(request)):
                        request.app[limiter_key].take(who.name)
            except ApiError as e:
                _close_if_unread(request, e)
                raise
            request[PRINCIPAL] = who
            _check_path(request)
        return await handler(request)

    return middleware
