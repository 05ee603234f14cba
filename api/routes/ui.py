"""The web console's page and its static assets, served under `/ui/` without a token.

The assets are the files shipped in `api/static/ui/` (package data), read once when the
routes are added; a name not among them is 404, so no request reaches the file system and
no path can escape the directory. The page holds no data: every API call it makes carries
the token the user typed (sessionStorage, Authorization header), which is why the page
itself needs none.

Every answer carries a strict Content-Security-Policy (scripts, styles and connections
only from this origin, no inline script, no framing), `nosniff` and `no-referrer`: what
the page renders includes strings users chose (tags, metadata, reasons), and these make a
rendering mistake harder to turn into script.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from checkpoint_vault.vault import NotFound

STATIC = Path(__file__).resolve().parent.parent / "static" / "ui"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; "
    "object-src 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",  # for browsers that predate frame-ancestors
    "Cross-Origin-Opener-Policy": "same-origin",
    # Revalidate every time (the ETag makes that a 304): a new server version's page and
    # scripts are never mixed with a cached old one.
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: str
    etag: str


def load_assets(root: Path = STATIC) -> dict[str, Asset]:
    """Every servable file directly in `root`, by name."""
    assets: dict[str, Asset] = {}
    for path in sorted(root.iterdir()):
        kind = CONTENT_TYPES.get(path.suffix)
        if kind is None or not path.is_file():
            continue
        body = path.read_bytes()
        assets[path.name] = Asset(body, kind, '"' + hashlib.sha256(body).hexdigest()[:32] + '"')
    return assets


ASSETS = web.AppKey("ui_assets", dict[str, Asset])


def _answer(request: web.Request, name: str) -> web.Response:
    asset = request.app[ASSETS].get(name)
    if asset is None:
        raise NotFound(f"no console file {name!r}")
    headers = {**SECURITY_HEADERS, "ETag": asset.etag}
    if request.headers.get("If-None-Match") == asset.etag:
        return web.Response(status=304, headers=headers)
    headers["Content-Type"] = asset.content_type
    return web.Response(body=asset.body, headers=headers)


async def ui_page(request: web.Request) -> web.Response:
    """The web console's page (no token needed; its API calls carry one)."""
    return _answer(request, "index.html")


async def ui_redirect(request: web.Request) -> web.Response:
    """To the web console's page (`/ui` -> `/ui/`, where its relative links resolve)."""
    # Relative, so a proxy serving the vault under a path prefix keeps it.
    return web.Response(status=302, headers={"Location": "ui/", **SECURITY_HEADERS})


async def ui_asset(request: web.Request) -> web.Response:
    """A script or style sheet of the web console (no token needed)."""
    return _answer(request, request.match_info["file"])


def add_routes(app: web.Application) -> None:
    app[ASSETS] = load_assets()
    app.router.add_get("/ui", ui_redirect)
    app.router.add_get("/ui/", ui_page)
    app.router.add_get("/ui/{file}", ui_asset)
