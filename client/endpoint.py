"""Which server a client talks to, as whom, and the URL paths it asks for.

Light on purpose (no event loop, no HTTP stack): `ckpt pull`'s path that skips the client
machinery (client/restore.py) needs these as much as `AsyncVaultClient`.
"""

from __future__ import annotations

import os
import ssl
import warnings
from pathlib import Path
from urllib.parse import quote, urlsplit

from checkpoint_vault.protocol import ADMIN_TOKEN_FILE, DEFAULT_DATA_DIR, DEFAULT_PORT, DEFAULT_URL

from .errors import InvalidName

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})  # host names that stay on this machine


def is_local_default(url: str) -> bool:
    """Is `url` the server `ckpt serve` starts by default (loopback, port 8470)?"""
    parts = urlsplit(url)
    return (
        parts.scheme in ("http", "https")
        and parts.hostname in LOOPBACK
        and parts.port == DEFAULT_PORT
    )


def default_token(url: str = DEFAULT_URL) -> str | None:
    """CKPT_TOKEN, else the admin token of a local ./ckpt-data (only for the local default
    server: that file is the local server's admin secret, and used to be sent to whatever
    URL was given, plain HTTP included), else None."""
    token = os.environ.get("CKPT_TOKEN")
    if token:
        return token
    path = Path(DEFAULT_DATA_DIR) / ADMIN_TOKEN_FILE
    return path.read_text().strip() if is_local_default(url) and path.is_file() else None


def warn_plain_http(url: str, token: str | None) -> None:
    """A bearer token over plain HTTP beyond loopback can be read off the network."""
    parts = urlsplit(url)
    if token and parts.scheme == "http" and parts.hostname not in LOOPBACK:
        warnings.warn(
            f"sending a token over plain HTTP to {parts.hostname}; use https:// (TLS)",
            PlainHttpWarning,
            stacklevel=3,
        )


def tls_from_env() -> ssl.SSLContext | None:
    """A verifying TLS context when CKPT_CA_FILE (trust this CA too, e.g. a private one)
    or CKPT_CLIENT_CERT / CKPT_CLIENT_KEY (present a certificate: mTLS) are set; None
    leaves the default (the system's CAs). Verification is never turned off."""
    ca = os.environ.get("CKPT_CA_FILE")
    cert = os.environ.get("CKPT_CLIENT_CERT")
    if not ca and not cert:
        return None
    ctx = ssl.create_default_context(cafile=ca or None)
    if cert:
        ctx.load_cert_chain(cert, os.environ.get("CKPT_CLIENT_KEY") or None)
    return ctx


class PlainHttpWarning(UserWarning):
    """A token is about to travel unencrypted beyond this machine."""


def ns_path(namespace: str) -> str:
    """The namespace as a URL path. Segments a URL library would rewrite (`a/../b` becomes
    `b`) are refused here, since the server never sees what the caller wrote."""
    if any(seg in ("", ".", "..") for seg in namespace.split("/")):
        raise InvalidName(f"invalid namespace {namespace!r}: empty, '.' or '..' segment")
    return quote(namespace, safe="/")


def file_path(namespace: str, ref: str, name: str) -> str:
    return f"/v1/namespaces/{ns_path(namespace)}/checkpoints/{ref}/files/{quote(name)}"
