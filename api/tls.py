"""TLS for the service itself: HTTPS, and optionally client certificates (mTLS).

Bearer tokens are secrets; beyond loopback they must not cross the network in clear. The
service used to speak plain HTTP only (a TLS proxy was the documented answer); now
`[server] tls_cert` / `tls_key` (PEM; the certificate file may hold the chain) make it
serve HTTPS itself, and `tls_client_ca` additionally requires every client to present a
certificate signed by that CA, on top of its token. TLS 1.2 is the floor.
"""

from __future__ import annotations

import ssl
from pathlib import Path


def server_context(cert: Path, key: Path, client_ca: Path | None = None) -> ssl.SSLContext:
    """An SSL context for the listening socket; raises OSError/ssl.SSLError on bad files."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    if client_ca is not None:
        ctx.load_verify_locations(cafile=client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx
