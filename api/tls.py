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


def exposure(key: Path) -> tuple[str, bool] | None:
    """Who besides its owner may use the key file: None, or a message and whether that is
    every user of the host (others' bits), who could then pose as this server. Group bits
    alone are what Kubernetes gives a Secret mounted with `fsGroup` (0440): the pod's own
    group, so they are only worth a warning."""
    mode = stat.S_IMODE(key.stat().st_mode)
    if not mode & 0o077:
        return None
    who = "every user of this host" if mode & 0o007 else "its group"
    return f"{key} is open to {who} (mode {mode:o}): chmod 600 it", bool(mode & 0o007)


def server_context(cert: Path, key: Path, client_ca: Path | None = None) -> ssl.SSLContext:
    """An SSL context for the listening socket; raises OSError/ssl.SSLError on bad files."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    if client_ca is not None:
        ctx.load_verify_locations(cafile=client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx
