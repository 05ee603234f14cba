"""TLS for the service itself: HTTPS, and optionally client certificates (mTLS).

Bearer tokens are secrets; beyond loopback they must not cross the network in clear. The
service used to speak plain HTTP only (a TLS proxy was the documented answer); now
`[server] tls_cert` / `tls_key` (PEM; the certificate file may hold the chain) make it
serve HTTPS itself, and `tls_client_ca` additionally requires every client to present a
certificate signed by that CA, on top of its token. TLS 1.2 is the floor.
"""

from __future__ import annotations

import ssl
import stat
from pathlib import Path


def exposure(key: Path) -> str | None:
    """Why the key file is open to other users (group or others may read or write it), or
    None. A key anyone on the host can read lets them pose as this server."""
    mode = stat.S_IMODE(key.stat().st_mode)
    if mode & 0o077:
        return f"{key} is open to other users (mode {mode:o}): chmod 600 it"
    return None


def server_context(cert: Path, key: Path, client_ca: Path | None = None) -> ssl.SSLContext:
    """An SSL context for the listening socket; raises OSError/ssl.SSLError on bad files."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    if client_ca is not None:
        ctx.load_verify_locations(cafile=client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx
